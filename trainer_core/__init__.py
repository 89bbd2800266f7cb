"""trainer_core: a parameter-server key-value store, collectives among the workers, gradient
compression, distributed learners and a PyTorch bridge (``trainer_core.torch``).

With ``DMLC_ROLE=scheduler`` or ``DMLC_ROLE=server`` in the environment, importing this package
runs that role and ends the process when the job ends, as ``import mxnet`` does (set
``TRAINER_CORE_AUTOSTART=0`` to import it without that). Workers use ``trainer_core.kv.create``.
"""

import os as _os

__version__ = "0.1.0"

if _os.environ.get("DMLC_ROLE") in ("scheduler", "server"):
    from trainer_core.ps.roles import autostart as _autostart

    _autostart()
