#!/usr/bin/env python3
"""Latency of the coordination service as seen by jaxlib's own client.

    jax_latency.py --address HOST:PORT [--tasks 2] [--iterations 200]
    jax_latency.py --builtin          [--tasks 2] [--iterations 200]

Starts --tasks client processes (one task each; default 2) against an
external service at --address, or against jaxlib's built-in C++ service
(`get_distributed_runtime_service`), which --builtin starts in this parent
process on a free 127.0.0.1 port.  Each client times, per iteration:

  kv_set           key_value_set of a fresh key (16-byte value)
  kv_blocking_get  blocking_key_value_get of a key that is present
  kv_try_get       key_value_try_get of a key that is present
  barrier          wait_at_barrier over all tasks (one id, reused: counters)
  kv_handoff       task 0 sets a key that task 1 is blocked on; set -> wake
                   (same-machine CLOCK_MONOTONIC on both sides)

plus connect and shutdown once per task.  Samples of all tasks are pooled;
prints ONE JSON object: {"ops": {op: {"median_ms", "p90_ms", "mean_ms",
"n"}}, ...}.  --warmup iterations per op are run first and not counted.
Everything is bounded by --deadline.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

OPS = ("kv_set", "kv_blocking_get", "kv_try_get", "barrier", "kv_handoff", "connect", "shutdown")


def pct(xs, p):
    """Nearest-rank percentile."""
    s = sorted(xs)
    i = max(0, min(len(s) - 1, int(-(-p * len(s) // 100)) - 1))
    return s[i]


def summarize(xs):
    return {"median_ms": round(statistics.median(xs), 3), "p90_ms": round(pct(xs, 90), 3),
            "mean_ms": round(statistics.fmean(xs), 3), "min_ms": round(min(xs), 3),
            "max_ms": round(max(xs), 3), "n": len(xs)}


# --------------------------------------------------------------------------
# worker (one task)


def worker(args) -> int:
    from jaxlib import _jax

    k, n, iters, warm = args.node_id, args.tasks, args.iterations, args.warmup
    ns = f"jax-latency/{args.run_id}"
    to = 60000
    now = time.monotonic
    samples = {op: [] for op in OPS}

    c = _jax.get_distributed_runtime_client(
        args.address, k, init_timeout=60, heartbeat_timeout=100, shutdown_timeout=60,
        use_compression=True)
    t = now()
    c.connect()
    samples["connect"].append((now() - t) * 1000)

    sync_n = [0]

    def sync():
        sync_n[0] += 1
        c.wait_at_barrier(f"{ns}/sync/{sync_n[0]}", to)

    value = "0123456789abcdef"
    sync()
    for i in range(warm + iters):
        key = f"{ns}/kv/{k}/{i}"
        t = now()
        c.key_value_set(key, value)
        dt = (now() - t) * 1000
        if i >= warm:
            samples["kv_set"].append(dt)
    sync()
    for i in range(warm + iters):
        key = f"{ns}/kv/{k}/{i}"
        t = now()
        v = c.blocking_key_value_get(key, to)
        dt = (now() - t) * 1000
        assert v == value, v
        if i >= warm:
            samples["kv_blocking_get"].append(dt)
    sync()
    for i in range(warm + iters):
        key = f"{ns}/kv/{k}/{i}"
        t = now()
        v = c.key_value_try_get(key)
        dt = (now() - t) * 1000
        assert v == value, v
        if i >= warm:
            samples["kv_try_get"].append(dt)
    sync()
    for i in range(warm + iters):
        t = now()
        c.wait_at_barrier(f"{ns}/barrier", to)
        dt = (now() - t) * 1000
        if i >= warm:
            samples["barrier"].append(dt)
    if n >= 2:
        # handoff: task 1 parks in GetKeyValue, task 0 sets the key ~2 ms
        # later, carrying its monotonic timestamp (system-wide clock).
        for i in range(warm + iters):
            sync()
            key = f"{ns}/handoff/{i}"
            if k == 0:
                time.sleep(0.002)
                c.key_value_set(key, repr(now()))
            elif k == 1:
                v = c.blocking_key_value_get(key, to)
                dt = (now() - float(v)) * 1000
                if i >= warm:
                    samples["kv_handoff"].append(dt)
    sync()
    t = now()
    c.shutdown()
    samples["shutdown"].append((now() - t) * 1000)
    print(json.dumps({"task": k, "samples": samples}), flush=True)
    return 0


# --------------------------------------------------------------------------
# parent


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
    raise SystemExit(f"built-in service did not listen on port {port}")


def parent(args) -> int:
    svc = None
    if args.builtin:
        from jaxlib import _jax
        port = free_port()
        address = f"127.0.0.1:{port}"
        svc = _jax.get_distributed_runtime_service(address, args.tasks, heartbeat_timeout=100,
                                                   shutdown_timeout=60)
        wait_listening(port)
    else:
        address = args.address
    run_id = f"{os.getpid()}-{time.time_ns()}"

    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # keep the clients' INFO logs out of the way
    procs = []
    for k in range(args.tasks):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--address", address,
               "--node-id", str(k), "--tasks", str(args.tasks), "--iterations", str(args.iterations),
               "--warmup", str(args.warmup), "--run-id", run_id]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      stdin=subprocess.DEVNULL, env=env, text=True))
    end = time.monotonic() + args.deadline
    outs = []
    failed = []
    for k, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            out, err = p.communicate()
            failed.append(f"task {k}: timed out after {args.deadline} s")
        if p.returncode != 0:
            failed.append(f"task {k}: exit {p.returncode}: {err.strip()[-2000:]}")
        outs.append(out)
    if svc is not None:
        svc.shutdown()
    if failed:
        print(json.dumps({"ok": False, "errors": failed}), flush=True)
        return 1

    pooled = {op: [] for op in OPS}
    for out in outs:
        line = [ln for ln in out.splitlines() if ln.startswith("{")][-1]
        for op, xs in json.loads(line)["samples"].items():
            pooled[op].extend(xs)
    result = {
        "ok": True,
        "service": "jaxlib-builtin" if args.builtin else address,
        "tasks": args.tasks,
        "iterations": args.iterations,
        "warmup": args.warmup,
        "ops": {op: summarize(xs) for op, xs in pooled.items() if xs},
    }
    print(json.dumps(result), flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--address", help="external coordination service host:port")
    g.add_argument("--builtin", action="store_true",
                   help="start jaxlib's built-in service in this process on a free 127.0.0.1 port")
    p.add_argument("--tasks", type=int, default=2, help="client processes (default 2)")
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--deadline", type=float, default=300, help="bound on the whole run, s")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--node-id", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--run-id", default="x", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.tasks < 1 or args.iterations < 1:
        p.error("--tasks and --iterations must be >= 1")
    if args.worker:
        import faulthandler
        faulthandler.dump_traceback_later(args.deadline + 5, exit=True)
        rc = worker(args)
        sys.stdout.flush()
        os._exit(rc)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
