"""A durable ``ClusterCoordinator``: TensorFlow's semantics
(``docs/protocols.md``, ClusterCoordinator closure queue semantics) over
coordstore's replicated closure queue, so the coordinator, any worker and
the Raft leader can each die without losing a closure or a result.

Closures are Python callables with their arguments, serialized with
cloudpickle; workers run them (``python -m coordstore.worker``). As in
TensorFlow: a closure runs at least once (a worker that dies has its
closures run elsewhere once its lease lapses); the first error a closure
raises is raised by the next :meth:`~ClusterCoordinator.schedule`,
:meth:`~ClusterCoordinator.join` or :meth:`~ClusterCoordinator.done` (once)
and cancels what is queued; fetching a cancelled value raises
:class:`coordstore.errors.ClosureCancelled`.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from . import _native
from .errors import ClosureFailed

_PENDING = object()


def _raise_closure_error(e: ClosureFailed) -> None:
    """Raises the closure's own exception (pickled by the worker) if it can
    be unpickled here, else ``e``."""
    if e.payload:
        try:
            original = pickle.loads(e.payload)
        except Exception:  # noqa: BLE001 - fall back to the wire error
            original = None
        if isinstance(original, BaseException):
            raise original from e
    raise e


class RemoteValue:
    """The future result of a scheduled closure."""

    def __init__(self, coordinator: "ClusterCoordinator", closure_id: int) -> None:
        self._c = coordinator
        self.closure_id = closure_id
        self._value: Any = _PENDING

    def fetch(self) -> Any:
        """Waits for the closure and returns its result; raises its error,
        or :class:`~coordstore.errors.ClosureCancelled`."""
        if self._value is _PENDING:
            try:
                raw = self._c._native.fetch(self.closure_id)
            except ClosureFailed as e:
                _raise_closure_error(e)
            self._value = pickle.loads(raw)
        return self._value

    def get(self) -> Any:
        """Same as :meth:`fetch`."""
        return self.fetch()

    def done(self) -> bool:
        """Whether the closure has an outcome (a result, an error, or
        cancelled)."""
        status, _ = self._c._native.outcome(self.closure_id, 0.0)
        return status != "pending"

    def __repr__(self) -> str:
        return f"RemoteValue(closure_id={self.closure_id})"


class ClusterCoordinator:
    """Schedules closures into queue ``queue`` on the coordstore cluster at
    ``endpoints`` (every node, ``HOST:PORT``) and collects their results.

    ``tag`` names this coordinator's closures, so that a coordinator started
    after this one died can find them (:meth:`attach`). Limits and the lease
    (seconds) apply when the queue is created; an existing queue must have
    the same ones.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        queue: str,
        *,
        tag: str = "coordinator",
        lease: Optional[float] = None,
        max_queued: Optional[int] = None,
        max_payload_bytes: Optional[int] = None,
        max_result_bytes: Optional[int] = None,
        namespace: Optional[str] = None,
        tls_ca: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        _native_coordinator: Optional[_native.Coordinator] = None,
    ) -> None:
        self.endpoints = list(endpoints)
        self.queue = queue
        self.tag = tag
        self.namespace = namespace
        self._native = _native_coordinator or _native.Coordinator.create(
            self.endpoints,
            queue,
            tag,
            lease_s=lease,
            max_queued=max_queued,
            max_payload_bytes=max_payload_bytes,
            max_result_bytes=max_result_bytes,
            namespace=namespace,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )

    @classmethod
    def attach(
        cls,
        endpoints: Sequence[str],
        queue: str,
        tag: str = "coordinator",
        namespace: Optional[str] = None,
        tls_ca: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
    ) -> "ClusterCoordinator":
        """Takes over queue ``queue`` from a coordinator that died: use the
        same ``tag`` and :meth:`scheduled` finds what it scheduled."""
        tls = {"tls_ca": tls_ca, "tls_cert": tls_cert, "tls_key": tls_key}
        native = _native.Coordinator.create(list(endpoints), queue, tag, namespace=namespace, **tls)
        return cls(endpoints, queue, tag=tag, namespace=namespace, _native_coordinator=native, **tls)

    def schedule(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Optional[Mapping[str, Any]] = None,
    ) -> RemoteValue:
        """Schedules ``fn(*args, **kwargs)`` on some worker; waits while the
        queue is full. Raises the queue's first error instead, if one is
        pending (that closure is not scheduled)."""
        # Imported here: the package is also used where cloudpickle is not
        # installed (torchrun's rendezvous handler in a torch venv).
        import cloudpickle

        payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
        try:
            closure_id = self._native.schedule(payload)
        except ClosureFailed as e:
            _raise_closure_error(e)
        return RemoteValue(self, closure_id)

    def join(self) -> None:
        """Waits until every scheduled closure ran; raises the first error a
        closure raised since the last join/done/schedule that raised one."""
        try:
            self._native.join()
        except ClosureFailed as e:
            _raise_closure_error(e)

    def done(self) -> bool:
        """Whether nothing is queued or running; raises the first error."""
        try:
            return self._native.done()
        except ClosureFailed as e:
            _raise_closure_error(e)
            raise  # unreachable

    def fetch(self, values: Any) -> Any:
        """The results of ``values``: one :class:`RemoteValue`, or a list,
        tuple or dict of them (nested), in the same structure; other leaves
        are returned as they are. Raises the first error among them."""
        leaves: list[RemoteValue] = []

        def collect(v: Any) -> None:
            if isinstance(v, RemoteValue):
                leaves.append(v)
            elif isinstance(v, (list, tuple)):
                for x in v:
                    collect(x)
            elif isinstance(v, dict):
                for x in v.values():
                    collect(x)

        collect(values)
        todo = [v for v in leaves if v._value is _PENDING]
        if todo:
            try:
                raws = self._native.fetch_all([v.closure_id for v in todo])
            except ClosureFailed as e:
                _raise_closure_error(e)
            for v, raw in zip(todo, raws):
                v._value = pickle.loads(raw)

        def build(v: Any) -> Any:
            if isinstance(v, RemoteValue):
                return v._value
            if isinstance(v, list):
                return [build(x) for x in v]
            if isinstance(v, tuple):
                return tuple(build(x) for x in v)
            if isinstance(v, dict):
                return {k: build(x) for k, x in v.items()}
            return v

        return build(values)

    def scheduled(self) -> list[RemoteValue]:
        """Every closure scheduled under this coordinator's tag, in order
        (after :meth:`attach`: what the coordinator before scheduled)."""
        return [RemoteValue(self, cid) for cid, _status, _attempts in self._native.scheduled()]

    def release(self, values: Sequence[RemoteValue]) -> int:
        """Drops the records of settled closures (results already fetched)."""
        return self._native.release([v.closure_id for v in values])
