"""pidfence: exactly-once Kafka pipelines, after the Kafka Idempotent Producer proposal.

Components (one subpackage each): ``wire`` (the ``pf`` header and shared types),
``broker_plugin`` (the broker-side rules), ``pid_allocator`` (the PID lease server),
``producer`` (the idempotent producer and copier), ``spark_sink`` (the Spark output sink),
``services`` (real ZooKeeper/Kafka/Spark for development and tests), ``verify`` (the checker).
"""

__version__ = "0.1.0"
