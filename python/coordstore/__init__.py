"""coordstore for Python: the coordination agent, preemption sync, a
durable ``ClusterCoordinator``, an in-process relay and torchrun's
rendezvous (``--rdzv-backend coordstore``, :mod:`coordstore.torchrun`) over
a replicated coordstore cluster.

>>> import coordstore
>>> agent = coordstore.Agent(["10.0.0.1:7470", "10.0.0.2:7470", "10.0.0.3:7470"], "worker", 0)
>>> agent.connect()                                    # doctest: +SKIP
>>> agent.insert("config/lr", "0.1")                   # doctest: +SKIP
"""

from . import errors
from .agent import Agent, PreemptionSyncManager, Watch
from .coordinator import ClusterCoordinator, RemoteValue
from .relay import Namespace, Relay, create_namespace, get_namespace
from .worker import PutBack

__all__ = [
    "Agent",
    "ClusterCoordinator",
    "Namespace",
    "PreemptionSyncManager",
    "PutBack",
    "Relay",
    "RemoteValue",
    "Watch",
    "create_namespace",
    "errors",
    "get_namespace",
]
