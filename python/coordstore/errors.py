"""Exceptions of coordstore calls, one class per gRPC status code.

Every failed call raises a subclass of :class:`CoordstoreError`; catch the
class of the code you expect (``except coordstore.errors.DeadlineExceeded``)
or the base class. ``code`` is the gRPC code number, ``message`` the
server's message.
"""

from __future__ import annotations


class CoordstoreError(Exception):
    """A coordstore call failed with a gRPC status."""

    code: int = 2

    def __init__(self, message: str = "", code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class Cancelled(CoordstoreError):
    code = 1


class Unknown(CoordstoreError):
    code = 2


class InvalidArgument(CoordstoreError):
    code = 3


class DeadlineExceeded(CoordstoreError):
    code = 4


class NotFound(CoordstoreError):
    code = 5


class AlreadyExists(CoordstoreError):
    code = 6


class PermissionDenied(CoordstoreError):
    code = 7


class ResourceExhausted(CoordstoreError):
    code = 8


class FailedPrecondition(CoordstoreError):
    code = 9


class Aborted(CoordstoreError):
    code = 10


class OutOfRange(CoordstoreError):
    code = 11


class Unimplemented(CoordstoreError):
    code = 12


class Internal(CoordstoreError):
    code = 13


class Unavailable(CoordstoreError):
    code = 14


class DataLoss(CoordstoreError):
    code = 15


class Unauthenticated(CoordstoreError):
    code = 16


class ClosureCancelled(Cancelled):
    """The closure was cancelled by an earlier closure's error (its result
    does not count), as TensorFlow's cancelled ``RemoteValue``."""

    def __init__(self, closure_id: int) -> None:
        super().__init__(f"closure {closure_id} was cancelled")
        self.closure_id = closure_id


class ClosureFailed(CoordstoreError):
    """A closure raised: the queue's first error. ``payload`` is what the
    worker sent (the Python worker sends the pickled exception, which
    :class:`coordstore.ClusterCoordinator` raises instead of this)."""

    def __init__(self, code: int, message: str, payload: bytes, closure_id: int) -> None:
        super().__init__(message, code)
        self.payload = payload
        self.closure_id = closure_id


_BY_CODE: dict[int, type[CoordstoreError]] = {
    c.code: c
    for c in (
        Cancelled,
        Unknown,
        InvalidArgument,
        DeadlineExceeded,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        ResourceExhausted,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        Unimplemented,
        Internal,
        Unavailable,
        DataLoss,
        Unauthenticated,
    )
}


def error_class(code: int) -> type[CoordstoreError]:
    """The exception class of gRPC code ``code`` (:class:`Unknown` if none)."""
    return _BY_CODE.get(code, Unknown)


def _from_status(code: int, message: str) -> CoordstoreError:
    return error_class(code)(message, code)


def _cancelled(closure_id: int) -> ClosureCancelled:
    return ClosureCancelled(closure_id)


def _closure_failed(code: int, message: str, payload: bytes, closure_id: int) -> ClosureFailed:
    return ClosureFailed(code, message, payload, closure_id)
