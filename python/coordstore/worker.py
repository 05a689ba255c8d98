"""A worker of a durable closure queue: ``python -m coordstore.worker
--queue NAME --endpoints HOST:PORT,...`` runs closures scheduled by
:class:`coordstore.ClusterCoordinator` until it is killed.

Each closure runs under a lease the worker renews (every third of it) while
the closure runs; if the worker dies, the closure runs again elsewhere once
the lease lapses. A closure that raises fails with its exception pickled
(the coordinator raises it); one that raises :class:`PutBack` goes back to
the queue for another worker.
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import Optional

from . import _native
from .errors import NotFound


class PutBack(Exception):
    """Raised by a closure that cannot run here: it goes back to the queue."""


def _error_payload(e: BaseException) -> bytes:
    import cloudpickle  # here, not at the top: see run()

    try:
        payload = cloudpickle.dumps(e)
        pickle.loads(payload)
        return payload
    except Exception:  # noqa: BLE001 - an exception that does not round-trip
        return b""


class _Renewer:
    """Renews the worker's leases every third of the lease while a closure
    runs."""

    def __init__(self, worker: _native.Worker, lease: float) -> None:
        self._worker = worker
        self._every = max(lease / 3.0, 0.01)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._worker.renew()
            except Exception as e:  # noqa: BLE001 - keep renewing
                print(f"coordstore worker: renewing the lease: {e}", file=sys.stderr)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run(
    endpoints: Sequence[str],
    queue: str,
    name: Optional[str] = None,
    prefetch: int = 1,
    stop: Optional[threading.Event] = None,
    namespace: Optional[str] = None,
    tls_ca: Optional[str] = None,
    tls_cert: Optional[str] = None,
    tls_key: Optional[str] = None,
) -> None:
    """Runs closures of ``queue`` (in ``namespace``; ``None``: the default
    one) until ``stop`` is set (or forever)."""
    # Imported here: `import coordstore` must work where cloudpickle is not
    # installed (torchrun's rendezvous handler in a torch venv).
    import cloudpickle

    name = name or f"{socket.gethostname()}-{os.getpid()}"
    worker = _native.Worker(
        list(endpoints), queue, name, namespace=namespace, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
    )
    waiting_for_queue = False
    while stop is None or not stop.is_set():
        try:
            closures, lease = worker.get(prefetch, 5.0)
        except NotFound:
            # Started before its coordinator created the queue: wait for it.
            if not waiting_for_queue:
                print(f"coordstore worker: waiting for queue {queue!r} to be created", file=sys.stderr)
                waiting_for_queue = True
            time.sleep(0.5)
            continue
        if not closures:
            continue
        renewer = _Renewer(worker, lease)
        results: list[tuple[int, bytes]] = []
        try:
            for closure_id, payload, _attempt, _tag in closures:
                try:
                    fn, args, kwargs = pickle.loads(payload)
                    value = fn(*args, **kwargs)
                except PutBack:
                    worker.put_back(closure_id)
                    continue
                except Exception as e:  # noqa: BLE001 - the closure's own error
                    message = f"{type(e).__name__}: {e}"
                    worker.fail(closure_id, 2, message, _error_payload(e))
                    continue
                results.append((closure_id, cloudpickle.dumps(value)))
        finally:
            renewer.stop()
        if results:
            worker.finish_many(results)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m coordstore.worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--queue", required=True, help="the closure queue's name")
    p.add_argument("--endpoints", required=True, help="every node, HOST:PORT,...")
    p.add_argument("--name", help="this worker's name (default: HOST-PID)")
    p.add_argument("--prefetch", type=int, default=1, help="closures taken per get (default 1)")
    p.add_argument("--namespace", help="the queue's namespace (default: the default one)")
    p.add_argument("--tls-ca", help="PEM CA of the nodes' certificates: dial them over TLS")
    p.add_argument("--tls-cert", help="PEM certificate to present (nodes with --tls-client-ca)")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    a = p.parse_args(argv)
    run(
        a.endpoints.split(","), a.queue, a.name, a.prefetch, namespace=a.namespace,
        tls_ca=a.tls_ca, tls_cert=a.tls_cert, tls_key=a.tls_key,
    )


if __name__ == "__main__":
    main()
