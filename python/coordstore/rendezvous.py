"""torchrun's rendezvous decided by coordstore (``--rdzv-backend coordstore``,
the default ``rendezvous=native``): torch 2.15's ``RendezvousHandler`` over
coordstore's ``Rendezvous`` service instead of torch's
``DynamicRendezvousHandler`` over one compare-and-set key.

torch's handler keeps a run's whole state (participants, wait list,
redundancy list, heartbeats) in one pickled blob that every agent reads,
changes and compare-and-sets, so N agents joining write O(N²) bytes, one
winner at a time, each a quorum commit. Here an agent's join is one small
write; the cluster puts it where torch's join op would (a participant, the
wait list, the redundancy list), forms the round at ``max_nodes`` or at
``min_nodes`` once the last call passed, and ranks the agents in torch's
order of node descriptors. An agent then waits at a node for its run to
change, sending keep-alives that the leader keeps in memory (no log entry
each); an agent the leader has not heard from for ``keep_alive_interval``
× ``keep_alive_max_attempt`` is dropped.

What torch's agent sees is torch's handler's: ``next_rendezvous`` (exit,
then join until the round forms; ``join_timeout``), ``num_nodes_waiting``
(cached for 1 s, as torch's state holder caches), ``is_closed``,
``set_closed``, ``shutdown`` (closes the run for good), keep-alives between
rounds on a daemon thread, the round's store as
``PrefixStore("torch.rendezvous.<run id>.<round>")`` over the agent's
TCPStore client, and the same errors (closed, graceful exit for a redundant
agent, timeout, connection).
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Optional

from torch.distributed import PrefixStore, Store
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)

from ._native import Rendezvous
from .errors import CoordstoreError, FailedPrecondition

log = logging.getLogger(__name__)

__all__ = ["NativeRendezvousHandler", "Timeouts"]

#: How long torch's state holder caches the state (num_nodes_waiting).
CACHE_S = 1.0

_local_ids = itertools.count()


class Timeouts:
    """torch's ``RendezvousTimeout`` in seconds: join 600, last call 30,
    close 30, heartbeat 5."""

    def __init__(
        self,
        join: Optional[float] = None,
        last_call: Optional[float] = None,
        close: Optional[float] = None,
        heartbeat: Optional[float] = None,
    ) -> None:
        self.join = 600.0 if join is None else join
        self.last_call = 30.0 if last_call is None else last_call
        self.close = 30.0 if close is None else close
        self.heartbeat = 5.0 if heartbeat is None else heartbeat
        for name in ("join", "last_call", "close", "heartbeat"):
            if getattr(self, name) <= 0:
                raise ValueError(f"the {name} timeout must be positive")


class NativeRendezvousHandler(RendezvousHandler):
    """torch's ``RendezvousHandler`` on coordstore's rendezvous service."""

    def __init__(
        self,
        *,
        backend: str,
        run_id: str,
        rendezvous: Rendezvous,
        store: Store,
        workers_store: RendezvousStoreInfo,
        min_nodes: int,
        max_nodes: int,
        local_addr: Optional[str] = None,
        timeouts: Optional[Timeouts] = None,
        keep_alive_interval: float = 5.0,
        keep_alive_max_attempt: int = 3,
        on_round: Optional[Callable[[RendezvousInfo], None]] = None,
        on_shutdown: Optional[Callable[[], None]] = None,
    ) -> None:
        if min_nodes < 1 or max_nodes < min_nodes:
            raise ValueError(f"1 <= min_nodes ({min_nodes}) <= max_nodes ({max_nodes})")
        if keep_alive_interval <= 0 or keep_alive_max_attempt < 1:
            raise ValueError("keep_alive_interval > 0 and keep_alive_max_attempt >= 1")
        self._backend = backend
        self._run_id = run_id
        self._rdzv = rendezvous
        self._store = store
        self._workers_store = workers_store
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.timeouts = timeouts or Timeouts()
        self.keep_alive_interval = keep_alive_interval
        self.keep_alive_max_attempt = keep_alive_max_attempt
        # torch's _NodeDesc: (address, pid, local id).
        self.node = (local_addr or socket.getfqdn(), os.getpid(), next(_local_ids))
        self._joined = False
        self._round: Optional[int] = None
        self._cached: tuple[float, int] = (0.0, 0)
        self._on_round = on_round
        self._on_shutdown = on_shutdown
        self._beat_stop: Optional[threading.Event] = None
        self._beat_thread: Optional[threading.Thread] = None

    # ------------------------------------------------------ RendezvousHandler

    def get_backend(self) -> str:
        return self._backend

    @property
    def use_agent_store(self) -> bool:
        """Every worker is a client of ``MASTER_ADDR:MASTER_PORT`` (the
        relay): no host serves a store."""
        return True

    def get_run_id(self) -> str:
        return self._run_id

    def next_rendezvous(self) -> RendezvousInfo:
        # torch skews the first join by up to 0.3 s to spread its
        # compare-and-sets; a join here is one write, so none.
        self._stop_heartbeats()
        try:
            outcome, rnd, rank, world_size = self._rdzv.next_rendezvous(
                *self.node,
                self.min_nodes,
                self.max_nodes,
                self.timeouts.last_call,
                self.keep_alive_interval,
                self.keep_alive_max_attempt,
                self.timeouts.join,
                self._joined,
            )
        except FailedPrecondition as e:
            if "feature level" in e.message:
                raise RendezvousConnectionError(
                    f"the cluster does not run the native rendezvous yet ({e.message}); "
                    "finish the upgrade, or pass --rdzv-conf rendezvous=c10d"
                ) from e
            raise RendezvousConnectionError(e.message) from e
        except CoordstoreError as e:
            raise RendezvousConnectionError(f"coordstore: {e.message}") from e
        self._joined = True
        if outcome == "closed":
            raise RendezvousClosedError()
        if outcome == "graceful_exit":
            raise RendezvousGracefulExitError(
                f"the rendezvous {self._run_id!r} closed while this node was redundant"
            )
        if outcome == "timeout":
            raise RendezvousTimeoutError(
                f"the rendezvous {self._run_id!r} did not form within {self.timeouts.join} s"
            )
        self._round = rnd
        # The wait list as it stood before this round formed is stale: torch's
        # next_rendezvous leaves its state freshly synced, so its agent's
        # next poll reads the new round's (a stale 1 here restarted a healthy
        # agent again right after the round formed).
        self._cached = (0.0, 0)
        log.info(
            "rendezvous %s round %d formed: node rank %d of %d (%s)",
            self._run_id, rnd, rank, world_size, _desc(self.node),
        )
        store = PrefixStore(f"torch.rendezvous.{self._run_id}.{rnd}", self._store)
        info = RendezvousInfo(store, rank, world_size, self._workers_store)
        if self._on_round is not None:
            self._on_round(info)
        self._start_heartbeats()
        return info

    def is_closed(self) -> bool:
        try:
            return bool(self._rdzv.view(*self.node)[2])
        except CoordstoreError as e:
            raise RendezvousConnectionError(f"coordstore: {e.message}") from e

    def set_closed(self) -> None:
        try:
            self._rdzv.close()
        except CoordstoreError as e:
            raise RendezvousConnectionError(f"coordstore: {e.message}") from e

    def num_nodes_waiting(self) -> int:
        at, waiting = self._cached
        now = time.monotonic()
        if now - at < CACHE_S:
            return waiting
        try:
            waiting = int(self._rdzv.view(*self.node)[4])
        except CoordstoreError as e:
            raise RendezvousConnectionError(f"coordstore: {e.message}") from e
        self._cached = (now, waiting)
        return waiting

    def shutdown(self) -> bool:
        self._stop_heartbeats()
        try:
            self.set_closed()
            return True
        except RendezvousConnectionError as e:
            log.warning("the rendezvous %s could not be closed: %s", self._run_id, e)
            return False
        finally:
            if self._on_shutdown is not None:
                self._on_shutdown()

    # ------------------------------------------------------------ heartbeats

    def _start_heartbeats(self) -> None:
        stop = threading.Event()
        rdzv, node, every = self._rdzv, self.node, self.keep_alive_interval

        def beat() -> None:
            while not stop.wait(every):
                try:
                    rdzv.keep_alive(*node)
                except CoordstoreError as e:
                    log.warning("rendezvous keep-alive failed: %s", e.message)

        self._beat_stop = stop
        self._beat_thread = threading.Thread(
            target=beat, name=f"RendezvousKeepAliveTimer_{node[2]}", daemon=True
        )
        self._beat_thread.start()

    def _stop_heartbeats(self) -> None:
        if self._beat_stop is not None:
            self._beat_stop.set()
            self._beat_stop = None
            self._beat_thread = None

    def __del__(self) -> None:
        self._stop_heartbeats()


def _desc(node: tuple[str, int, int]) -> str:
    return f"{node[0]}_{node[1]}_{node[2]}"


def handler_options(params: Any) -> dict[str, Any]:
    """torch's options as its ``create_handler`` reads them (seconds)."""

    def seconds(key: str) -> Optional[float]:
        v = params.get_as_int(f"{key}_timeout")
        return None if v is None else float(v)

    return {
        "timeouts": Timeouts(
            seconds("join"), seconds("last_call"), seconds("close"), seconds("heartbeat")
        ),
        "keep_alive_interval": float(params.get_as_int("keep_alive_interval", 5)),
        "keep_alive_max_attempt": params.get_as_int("keep_alive_max_attempt", 3),
    }
