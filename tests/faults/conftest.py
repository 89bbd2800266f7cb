"""The real-host fixtures the fault cases share with tests/cluster: namespace hosts (netns_hosts,
with netns_session beside it) and a python with numpy and pyzmq that those hosts can run."""

from tests.cluster.conftest import netns_hosts, netns_session  # noqa: F401
from tests.cluster.test_trainer_core_ssh import host_python  # noqa: F401
