"""The soak run behind ``pidfence bench soak``: the demo's pipeline for a long time, faults
repeated, memory and batch times sampled, the event-level checker at the end.

* :mod:`.config`: :class:`SoakConfig` and its environment knobs;
* :mod:`.run`: :func:`run_soak` / :class:`SoakRun`, the run itself; :mod:`.result` what it keeps;
* :mod:`.faults`: the sink process and the faults the soak repeats;
* :mod:`.sample`: one sample (RSS, batch times, state size);
* :mod:`.sink`: the sink's driver process (``python -m pidfence.demo.soak.sink``);
* :mod:`.figures` and :mod:`.plot`: the report's figures.
"""

from pidfence.demo.soak.config import SoakConfig, config_from_env
from pidfence.demo.soak.result import SoakResult
from pidfence.demo.soak.run import SoakRun, run_soak

__all__ = ["SoakConfig", "SoakResult", "SoakRun", "config_from_env", "run_soak"]
