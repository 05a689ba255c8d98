"""The coordination agent of one task (TensorFlow's CoordinationServiceAgent
API, see ``docs/protocols.md``), over the Rust agent.

Blocking calls release the GIL; each has an ``*_async`` twin for asyncio
that runs it in a worker thread. The agent knows every node: a call whose
node dies goes on at another one (exactly once), so a blocking get or a
barrier rides through a leader failover.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Optional, Union

from . import _native
from .errors import CoordstoreError

Value = Union[bytes, str]
PathLike = Union[str, "os.PathLike[str]"]


def _b(v: Value) -> bytes:
    return v.encode() if isinstance(v, str) else bytes(v)


class Watch:
    """Changes of a watched key and everything under it, in order, without
    gaps or repeats across node failures: ``(key, value)`` pairs, ``value``
    None for a deletion. Iterate it (``for key, value in watch``), or call
    :meth:`next` with a timeout; :meth:`close` (or ``with``) stops it."""

    def __init__(self, native: _native.Watch) -> None:
        self._w = native

    def next(self, timeout: Optional[float] = None) -> Optional[tuple[str, Optional[bytes]]]:
        """The next change; None if ``timeout`` seconds pass first."""
        return self._w.next(timeout)

    def __iter__(self) -> Iterator[tuple[str, Optional[bytes]]]:
        return self

    def __next__(self) -> tuple[str, Optional[bytes]]:
        change = self._w.next(None)
        assert change is not None
        return change

    def __aiter__(self) -> AsyncIterator[tuple[str, Optional[bytes]]]:
        return self

    async def __anext__(self) -> tuple[str, Optional[bytes]]:
        try:
            return await asyncio.to_thread(self.__next__)
        except StopIteration:
            raise StopAsyncIteration from None

    def close(self) -> None:
        """Stops the watch."""
        self._w.close()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Agent:
    """The coordination agent of task ``task_id`` of job ``job_name``.

    ``endpoints`` names every node (``HOST:PORT``); ``namespace`` the
    namespace of the task's job (``None``: the default one). ``on_error`` is called
    (from a background thread) with a :class:`coordstore.errors.CoordstoreError`
    whenever the agent enters ERROR: an error this task reported, or one the
    service propagated from another task.

    TLS (the Rust agent's, and ``coordstore ctl``'s ``--tls-ca``,
    ``--tls-cert``, ``--tls-key``): ``tls_ca`` is the PEM file of the CA
    that signed the nodes' certificates (the nodes are then dialed over TLS,
    each checked for the host dialed); ``tls_cert`` and ``tls_key`` are this
    task's client certificate and key, for a cluster with mutual TLS
    (``--tls-client-ca``). None of them: plaintext.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        job_name: str,
        task_id: int,
        *,
        heartbeat_interval: float = 10.0,
        retry_for: float = 300.0,
        on_error: Optional[Callable[[CoordstoreError], None]] = None,
        namespace: Optional[str] = None,
        tls_ca: Optional[PathLike] = None,
        tls_cert: Optional[PathLike] = None,
        tls_key: Optional[PathLike] = None,
    ) -> None:
        self._a = _native.Agent(
            list(endpoints),
            job_name,
            task_id,
            heartbeat_interval_s=heartbeat_interval,
            retry_for_s=retry_for,
            on_error=on_error,
            namespace=namespace,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )

    @property
    def state(self) -> str:
        """"UNINITIALIZED", "DISCONNECTED", "CONNECTED" or "ERROR"."""
        return self._a.state

    def connect(self) -> None:
        """Registers this task (waits for the others if the service says so)
        and starts heartbeats."""
        self._a.connect()

    def shutdown(self) -> None:
        """Leaves the job (the shutdown barrier, if the service has one)."""
        self._a.shutdown()

    def reset(self) -> None:
        """From ERROR back to DISCONNECTED, to connect again."""
        self._a.reset()

    def report_error(self, code: int, message: str) -> None:
        """Reports an error of this task; the service propagates it."""
        self._a.report_error(code, message)

    def task_status(self, job_name: str, task_id: int) -> tuple[str, int, int, str]:
        """(state, incarnation, error code, error message) of a task."""
        return self._a.task_status(job_name, task_id)

    def get(self, key: str, timeout: Optional[float] = None) -> bytes:
        """The value of ``key``, waiting until it is set (up to ``timeout``
        seconds: :class:`~coordstore.errors.DeadlineExceeded` after)."""
        return self._a.get(key, timeout)

    def try_get(self, key: str) -> Optional[bytes]:
        """The value of ``key`` now, or None."""
        return self._a.try_get(key)

    def get_dir(self, key: str) -> list[tuple[str, bytes]]:
        """Every ``(key, value)`` under directory ``key``."""
        return self._a.get_dir(key)

    def insert(self, key: str, value: Value) -> None:
        """Sets ``key``; :class:`~coordstore.errors.AlreadyExists` if set."""
        self._a.insert(key, _b(value))

    def update(self, key: str, value: Value) -> None:
        """Sets ``key``, replacing a value it has."""
        self._a.update(key, _b(value))

    def increment(self, key: str, by: int = 1) -> int:
        """Adds ``by`` to the integer value of ``key`` (absent: 0) and returns
        the new value, exactly once even across a failover."""
        return self._a.increment(key, by)

    def delete(self, key: str) -> None:
        """Deletes ``key`` and everything under it."""
        self._a.delete(key)

    def watch(self, key: str) -> Watch:
        """Watches ``key`` and everything under it from now on."""
        return Watch(self._a.watch(key))

    def barrier(
        self,
        barrier_id: str,
        timeout: float,
        tasks: Sequence[tuple[str, int]] = (),
    ) -> None:
        """Waits until every task of ``tasks`` ((job, task id) pairs; empty:
        the whole job) reached barrier ``barrier_id``, up to ``timeout`` s."""
        self._a.barrier(barrier_id, timeout, list(tasks))

    def cancel_barrier(self, barrier_id: str) -> None:
        """Fails barrier ``barrier_id`` for everyone waiting at it."""
        self._a.cancel_barrier(barrier_id)

    # asyncio twins of the blocking calls (run in a worker thread).
    async def connect_async(self) -> None:
        await asyncio.to_thread(self.connect)

    async def get_async(self, key: str, timeout: Optional[float] = None) -> bytes:
        return await asyncio.to_thread(self.get, key, timeout)

    async def insert_async(self, key: str, value: Value) -> None:
        await asyncio.to_thread(self.insert, key, value)

    async def barrier_async(
        self, barrier_id: str, timeout: float, tasks: Sequence[tuple[str, int]] = ()
    ) -> None:
        await asyncio.to_thread(self.barrier, barrier_id, timeout, tasks)

    async def shutdown_async(self) -> None:
        await asyncio.to_thread(self.shutdown)


class PreemptionSyncManager:
    """Preemption sync (``docs/protocols.md``, Preemption sync) with JAX's
    keys and barrier, so Python tasks and stock JAX tasks can share one job:
    when any task learns it will be preempted, all agree on one step to stop
    at (the fastest task's step + 1), and :meth:`reached_sync_point` is True
    at that step.

    ``notifier``: ``"sigterm"`` (a SIGTERM to this process announces the
    preemption) or ``"manual"`` (call :meth:`notify`). The agent must be
    connected.
    """

    def __init__(self, agent: Agent, notifier: str = "sigterm") -> None:
        self._m = _native.PreemptionSyncManager(agent._a, notifier)

    def reached_sync_point(self, step: int) -> bool:
        """Records ``step`` as this task's current step; True exactly at the
        agreed sync point (waits while the tasks are agreeing)."""
        return self._m.reached_sync_point(step)

    @property
    def sync_point(self) -> Optional[int]:
        """The agreed step, once decided."""
        return self._m.sync_point

    def notify(self, death_time: float) -> None:
        """Announces this task's preemption at ``death_time`` (seconds since
        the epoch); ``notifier="manual"`` only."""
        self._m.notify(death_time)

    def shutdown(self) -> None:
        """Stops the manager (cancels the barrier if no point was agreed)."""
        self._m.shutdown()
