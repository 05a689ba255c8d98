#!/usr/bin/env python3
"""Stock torch 2.15 TCPStore clients that keep working while a store node
fails, timing every op (the gray-failure tests, tests/tests/gray.rs).

    torch_gray.py --host H --port P --prefix NAME [--pause-ms 20]
                  [--timeout-s 120] [--deadline 600]

Two connections to H:P (`torch.distributed.TCPStore(..., is_master=False)`,
which never reconnects: a broken connection is an error):

 * the writer: set(k_i, v_i), then get(k_i) (an op with a reply) and
   add(NAME/count, 1), every --pause-ms;
 * the waiter: wait([k_i]) for the writer's next key, then get(k_i); its
   hand-off lag is the time from the writer's acknowledged set to the
   waiter's wake.

Prints READY once both connections are up and have done one round, then
runs until a line "stop" arrives on stdin; then it reads every acknowledged
key back on a fresh connection and prints one JSON line

    {"summary": {"ops": N, "errors": [...], "lost": [...],
                 "max_ms": {"set": .., "get": .., "add": .., "wait": ..,
                            "handoff": ..},
                 "p50_ms": {...}, "counter": C, "adds": A}}

and exits 0 if no op failed and nothing was lost, 1 otherwise, 124 after
--deadline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import warnings
from datetime import timedelta

warnings.filterwarnings("ignore")

import torch.distributed as dist  # noqa: E402

_out = threading.Lock()


def emit(obj) -> None:
    with _out:
        sys.stdout.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        sys.stdout.flush()


def watchdog(seconds: float) -> None:
    def fire() -> None:
        emit({"summary": {"watchdog": True}})
        os._exit(124)

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()


class Run:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.lat: dict[str, list[float]] = {k: [] for k in ("set", "get", "add", "wait", "handoff")}
        self.errors: list[str] = []
        self.acked: dict[str, bytes] = {}
        self.set_at: dict[int, float] = {}
        self.adds = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.next_key = 0

    def key(self, i: int) -> str:
        return f"{self.prefix}/k/{i}"

    def timed(self, op: str, fn):
        t0 = time.monotonic()
        r = fn()
        with self.lock:
            self.lat[op].append((time.monotonic() - t0) * 1000)
        return r

    def fail(self, who: str, e: BaseException) -> None:
        with self.lock:
            self.errors.append(f"{who}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        self.stop.set()


def writer(run: Run, store, pause_s: float, ready: threading.Event) -> None:
    i = 0
    try:
        while not run.stop.is_set():
            k, v = run.key(i), f"v{i}".encode()
            run.timed("set", lambda: store.set(k, v))
            with run.lock:
                run.acked[k] = v
                run.set_at[i] = time.monotonic()
                run.next_key = i + 1
            got = run.timed("get", lambda: store.get(k))
            if got != v:
                raise RuntimeError(f"get({k}) = {got!r}, set {v!r}")
            run.timed("add", lambda: store.add(f"{run.prefix}/count", 1))
            with run.lock:
                run.adds += 1
            i += 1
            ready.set()
            time.sleep(pause_s)
    except Exception as e:  # noqa: BLE001 - every failure is reported
        run.fail("writer", e)


def waiter(run: Run, store, ready: threading.Event) -> None:
    i = 0
    try:
        while not run.stop.is_set():
            k = run.key(i)
            t0 = time.monotonic()
            store.wait([k])
            woke = time.monotonic()
            with run.lock:
                run.lat["wait"].append((woke - t0) * 1000)
                at = run.set_at.get(i)
                if at is not None:
                    run.lat["handoff"].append(max(0.0, woke - at) * 1000)
            run.timed("get", lambda: store.get(k))
            i += 1
            ready.set()
    except Exception as e:  # noqa: BLE001
        run.fail("waiter", e)


def summary(run: Run, host: str, port: int, timeout: timedelta) -> dict:
    lost = []
    try:
        check = dist.TCPStore(host, port, is_master=False, timeout=timeout)
        for k, v in run.acked.items():
            got = check.get(k)
            if got != v:
                lost.append({"key": k, "got": repr(got), "want": repr(v)})
        counter = int(check.add(f"{run.prefix}/count", 0))
    except Exception as e:  # noqa: BLE001
        run.errors.append(f"read back: {type(e).__name__}: {e}")
        counter = -1
    if counter not in (-1, run.adds, run.adds + 1):
        # the last add's answer may have been lost with the process only
        lost.append({"counter": counter, "adds": run.adds})
    return {
        "ops": sum(len(v) for v in run.lat.values()),
        "errors": run.errors,
        "lost": lost,
        "max_ms": {k: round(max(v), 1) if v else None for k, v in run.lat.items()},
        "p50_ms": {k: round(statistics.median(v), 2) if v else None for k, v in run.lat.items()},
        "counter": counter,
        "adds": run.adds,
        "acked": len(run.acked),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--pause-ms", type=float, default=20)
    ap.add_argument("--timeout-s", type=float, default=120)
    ap.add_argument("--deadline", type=float, default=600)
    a = ap.parse_args()
    watchdog(a.deadline)
    timeout = timedelta(seconds=a.timeout_s)
    run = Run(a.prefix)
    w_store = dist.TCPStore(a.host, a.port, is_master=False, timeout=timeout)
    q_store = dist.TCPStore(a.host, a.port, is_master=False, timeout=timeout)
    w_ready, q_ready = threading.Event(), threading.Event()
    threads = [
        threading.Thread(target=writer, args=(run, w_store, a.pause_ms / 1000, w_ready), daemon=True),
        threading.Thread(target=waiter, args=(run, q_store, q_ready), daemon=True),
    ]
    for t in threads:
        t.start()
    while not (w_ready.is_set() and q_ready.is_set()) and not run.stop.is_set():
        time.sleep(0.01)
    emit("READY")
    for line in sys.stdin:
        if line.strip() == "stop":
            break
    run.stop.set()
    # The waiter may wait for a key that never comes: set it.
    try:
        w_store.set(run.key(run.next_key), b"end")
    except Exception:  # noqa: BLE001
        pass
    for t in threads:
        t.join(timeout=a.timeout_s)
    s = summary(run, a.host, a.port, timeout)
    emit({"summary": s})
    return 0 if not s["errors"] and not s["lost"] else 1


if __name__ == "__main__":
    sys.exit(main())
