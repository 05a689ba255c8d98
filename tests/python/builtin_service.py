#!/usr/bin/env python3
"""Run jaxlib's own (reference, C++) coordination service standalone.

    builtin_service.py --num-tasks N [--port P] [--seconds S]

Binds 127.0.0.1 (port 0 = a free one), prints `LISTENING 127.0.0.1:<port>`
on stdout once it accepts connections, and serves until SIGTERM/SIGINT, until
stdin reaches EOF (with --until-stdin-eof), or until --seconds elapse.  Used
to check the Python drivers against the reference implementation.
"""

import argparse
import os
import signal
import socket
import sys
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"service did not start listening on port {port}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-tasks", type=int, required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seconds", type=float, default=600, help="serve at most this long")
    p.add_argument("--heartbeat-timeout", type=int, default=100, help="s")
    p.add_argument("--shutdown-timeout", type=int, default=60, help="s")
    p.add_argument("--cluster-register-timeout", type=int, default=None, help="s")
    p.add_argument("--recoverable", action="store_true")
    p.add_argument("--until-stdin-eof", action="store_true")
    args = p.parse_args()

    from jaxlib import _jax

    port = args.port or free_port()
    addr = f"127.0.0.1:{port}"
    kw = dict(heartbeat_timeout=args.heartbeat_timeout, shutdown_timeout=args.shutdown_timeout,
              recoverable=args.recoverable)
    if args.cluster_register_timeout is not None:
        kw["cluster_register_timeout"] = args.cluster_register_timeout
    svc = _jax.get_distributed_runtime_service(addr, args.num_tasks, **kw)
    wait_listening(port)
    print(f"LISTENING {addr}", flush=True)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.until_stdin_eof:
        def eof():
            sys.stdin.read()
            stop.set()
        threading.Thread(target=eof, daemon=True).start()
    stop.wait(args.seconds)
    svc.shutdown()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
