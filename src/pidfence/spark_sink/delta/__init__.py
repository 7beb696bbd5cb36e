"""The sink's Delta Lake layer: the output log and the rejects log as two Delta tables.

| module | concept |
|---|---|
| :mod:`.table` | the table spec (schema, marker, format), create-or-open, column check |
| :mod:`.history` | sharing the table: what other writers' commits mean for the sink |
| :mod:`.commit` | exactly-once batch commits (driver) |
| :mod:`.stats` | Delta file statistics |
| :mod:`.constraints` | CHECK constraints enforced on the sink's rows |
| :mod:`.checkpoints` | checkpoints and log cleanup after commits |
| :mod:`.care` | compaction, vacuum, checkpoints on demand |
| :mod:`.errors` | what the layer raises, each with ``retriable`` |

The output path as a whole (the two tables and the sink's own files) is
:class:`pidfence.spark_sink.output.Output`.
"""
