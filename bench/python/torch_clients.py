#!/usr/bin/env python3
"""Real PyTorch ranks against a TCPStore server: what a job's start-up does.

    torch_clients.py --addresses HOST:PORT[,HOST:PORT...] --ranks N
                     [--procs 8] [--timeout-s 600]

N ranks, each one `torch.distributed.TCPStore` client of the installed torch
on a thread of its own, spread over --procs processes (rank r in process
r % procs, connected to address r % len(addresses)). Phases, each run by
every rank at once and timed from its start to the slowest rank's end:

  connect   TCPStore(host, port, world_size=N, is_master=False,
            wait_for_workers=True): torch's client connects (with its own
            retry and backoff), validates, and ADDs its `init/` key
  init      add(`bench/count`, 1) and set(`bench/rank/<r>`, 32 bytes)
  barrier1  torch's own `_store_based_barrier` (what init_process_group
            runs) over the N ranks
  nccl-id   rank 0 sets `bench/nccl_id` (128 bytes); every rank gets it
            (torch's get waits for the key)
  barrier2  `_store_based_barrier` again, another key

Protocol with the caller (coordstore-bench): prints READY once every
process has its threads, then for each phase reads one line from stdin
(the go), runs the phase and prints `PHASE {json}` with phase, seconds,
errors and first_error. A rank whose phase fails reports its error and
takes no part in later phases (they time out on the others: --timeout-s).
"""

import argparse
import datetime
import json
import multiprocessing as mp
import os
import sys
import threading
import time

PHASES = ("connect", "init", "barrier1", "nccl-id", "barrier2")


def rank_phase(phase, r, n, store, addr, timeout):
    """One rank's part of `phase`; the store (made in `connect`)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if phase == "connect":
        host, port = addr
        return dist.TCPStore(host, port, world_size=n, is_master=False, timeout=timeout,
                             wait_for_workers=True, use_libuv=True)
    if store is None:
        raise RuntimeError("not connected")
    if phase == "init":
        store.add("bench/count", 1)
        store.set(f"bench/rank/{r}", b"x" * 32)
    elif phase in ("barrier1", "barrier2"):
        c10d._store_based_barrier(r, store, f"bench-{phase}", n, timeout)
    elif phase == "nccl-id":
        if r == 0:
            store.set("bench/nccl_id", b"i" * 128)
        if len(store.get("bench/nccl_id")) != 128:
            raise RuntimeError("the id read back is not 128 bytes")
    return store


def child(p, procs, n, addresses, timeout_s, conn):
    """Process `p`: its ranks on threads; each phase on the parent's go."""
    import torch.distributed  # noqa: F401 (imported before the clock runs)

    threading.stack_size(512 * 1024)
    ranks = list(range(p, n, procs))
    timeout = datetime.timedelta(seconds=timeout_s)
    start = threading.Barrier(len(ranks) + 1)
    done = threading.Barrier(len(ranks) + 1)
    ends = [0.0] * len(ranks)
    errors = [None] * len(ranks)

    def run(i, r):
        store = None
        addr = addresses[r % len(addresses)]
        for phase in PHASES:
            start.wait()
            errors[i] = None
            if phase != "connect" and store is None:
                errors[i] = "not connected"
            else:
                try:
                    store = rank_phase(phase, r, n, store, addr, timeout)
                except Exception as e:  # noqa: BLE001 (each rank's failure is reported)
                    errors[i] = f"rank {r}: {type(e).__name__}: {e}"
            ends[i] = time.monotonic()
            done.wait()
        if store is not None:
            del store

    threads = [threading.Thread(target=run, args=(i, r), daemon=True) for i, r in enumerate(ranks)]
    for t in threads:
        t.start()
    conn.send("ready")
    for _ in PHASES:
        try:
            conn.recv()
        except EOFError:  # the parent stopped early: no more phases
            os._exit(0)
        start.wait()
        done.wait()
        failed = [e for e in errors if e is not None]
        conn.send((max(ends, default=0.0), len(failed), failed[0] if failed else None))
    for t in threads:
        t.join(timeout=5)
    conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addresses", required=True)
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    a = ap.parse_args()
    addresses = []
    for hp in a.addresses.split(","):
        host, port = hp.rsplit(":", 1)
        addresses.append((host, int(port)))
    procs = max(1, min(a.procs, a.ranks))
    ctx = mp.get_context("spawn")
    conns, children = [], []
    for p in range(procs):
        mine, theirs = ctx.Pipe()
        c = ctx.Process(target=child, args=(p, procs, a.ranks, addresses, a.timeout_s, theirs),
                        daemon=True)
        c.start()
        conns.append(mine)
        children.append(c)
    for c in conns:
        if c.recv() != "ready":
            sys.exit("a client process did not start")
    print("READY", flush=True)
    for phase in PHASES:
        if not sys.stdin.readline():
            break
        t0 = time.monotonic()
        for c in conns:
            c.send(phase)
        results = [c.recv() for c in conns]
        errors = sum(e for _, e, _ in results)
        first = next((f for _, _, f in results if f is not None), None)
        seconds = max(end for end, _, _ in results) - t0
        print("PHASE " + json.dumps({"phase": phase, "seconds": round(seconds, 4),
                                     "errors": errors, "first_error": first}), flush=True)
    for c in conns:
        c.close()
    for c in children:
        c.join(timeout=10)
        if c.is_alive():
            c.kill()
    os._exit(0)


if __name__ == "__main__":
    main()
