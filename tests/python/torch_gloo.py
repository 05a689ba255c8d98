#!/usr/bin/env python3
"""One rank of a gloo job whose c10d store is coordstore (stock torch 2.15).

    torch_gloo.py --rank R --world N --host H --port P [--init store|env]
                  [--rounds K] [--adds-per-round A] [--counter KEY]

--init store: init_process_group(store=TCPStore(H, P, is_master=False)).
--init env:   init_process_group(init_method="env://") with MASTER_ADDR=H,
              MASTER_PORT=P and TORCHELASTIC_USE_AGENT_STORE=True, so every
              rank is a client of the store (none hosts one).

Then K rounds: every rank ADDs 1 to the store counter A times (each return
value must be larger than the one before) and all-reduces its rank + 1 (the
sum must be N(N+1)/2). A closing barrier, then rank 0 reads the counter.
Prints one JSON line per round and a last {"done": ...} line; exits 0 only
if every check held. A broken store connection raises (torch's client never
reconnects), so the rank exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from datetime import timedelta

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--init", choices=["store", "env"], default="store")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--adds-per-round", type=int, default=5)
    ap.add_argument("--counter", default="adds")
    ap.add_argument("--timeout-s", type=float, default=120)
    a = ap.parse_args()
    timeout = timedelta(seconds=a.timeout_s)

    if a.init == "store":
        store = dist.TCPStore(a.host, a.port, is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=a.rank, world_size=a.world,
                                timeout=timeout)
    else:
        os.environ["MASTER_ADDR"] = a.host
        os.environ["MASTER_PORT"] = str(a.port)
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        dist.init_process_group("gloo", init_method="env://", rank=a.rank,
                                world_size=a.world, timeout=timeout)
        store = dist.TCPStore(a.host, a.port, is_master=False, timeout=timeout)
    emit({"rank": a.rank, "initialized": True})

    ok = True
    last = 0
    want = a.world * (a.world + 1) / 2
    for r in range(a.rounds):
        for _ in range(a.adds_per_round):
            got = store.add(a.counter, 1)
            ok &= got > last
            last = got
        t = torch.tensor([float(a.rank + 1)])
        dist.all_reduce(t)
        ok &= t.item() == want
        emit({"rank": a.rank, "round": r, "sum": t.item(), "last_add": last})

    dist.barrier()
    total = int(store.get(a.counter)) if a.rank == 0 else None
    emit({"done": {"rank": a.rank, "ok": ok, "counter": total}})
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
