"""What a launch backend can do, as it declares it: ``Capabilities``, a frozen value that each
backend class sets as its ``capabilities`` (docs/backends.md, "Adding a backend"). The launcher
asks it instead of asking a backend's name: which flags apply, where the hosts come from, whether
the processes run on this machine, who serves the root of a job without servers. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from launchkit.core.flags import EngineFlag

#: Where a backend's hosts come from: the hostfile (``-H``); this machine; the Slurm allocation
#: (or placeholders for the nodes a batch job will get, ``--nodes``); one placeholder per
#: process (the engine places each task); one placeholder for the whole job (the engine places it).
HostSource = Literal["hostfile", "here", "allocation", "per task", "engine"]

#: What a backend can do with a running job's workers (``-n MIN:MAX``, docs/elastic.md): nothing
#: (an elastic job is refused), let them leave (an engine's allocation, to which no process can be
#: added: the job starts MAX, which must fit), or let them leave and start new ones (local, ssh).
Elasticity = Literal["none", "shrink", "resize"]


@dataclass(frozen=True)
class Capabilities:
    """A backend's declaration. The defaults are a backend that starts processes on the
    hostfile's hosts and takes no option."""

    hosts: HostSource = "hostfile"
    #: the backend cannot run without a hostfile (ssh)
    needs_hostfile: bool = False
    #: why a hostfile is ignored, said in the warning ("" where ``hosts`` is "hostfile")
    hostfile_ignored: str = ""
    #: every process runs on this machine (local): the scheduler's address is loopback, the
    #: processes publish it, start in the launcher's directory and are sampled here
    here: bool = False
    #: the processes get the launcher's own environment (local; srun's --export=ALL): a variable
    #: set there is the user's, which the launcher's defaults (OMP_NUM_THREADS) leave alone
    inherits_env: bool = False
    #: the launcher opens its own connection to every host (ssh): a --scheduler-ip name must
    #: resolve here, and the scheduler's address is the local end of the connection to the first
    connects: bool = False
    #: without servers (-s 0) no scheduler process runs: worker 0 serves the rendezvous
    root_in_worker0: bool = True
    #: --max-restarts: the launcher restarts the whole job after a failure
    restarts: bool = False
    #: -n MIN:MAX: what it can do with a running job's workers
    elastic: Elasticity = "none"
    #: --detach: the job is a batch job that can be submitted and left
    detaches: bool = False
    #: --sync-dst-dir, --sync-timeout, --sync-exclude: the launcher copies the directory over
    syncs: bool = False
    #: the keyword options its constructor takes (``backends.get_backend``)
    options: frozenset[str] = field(default_factory=frozenset)
    #: the flags of ``launchkit launch`` it takes (``core.flags``), which its ``flag_options`` turns
    #: into those options; one given for a backend that does not list it is refused (exit 2)
    flags: tuple[EngineFlag, ...] = ()
    #: ``launchkit hosts list --from NAME`` reads the hosts its engine gives (``given_hosts``)
    #: from there, as the help says it ("" : it gives none)
    gives_hosts: str = ""
