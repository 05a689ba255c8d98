#!/usr/bin/env python3
"""One rank of a stuck gloo job whose c10d store is coordstore (stock torch 2.15).

    torch_stuck.py --rank R --world N --host H --port P --mode id|barrier
                   [--key KEY] [--group NAME] [--holdout K]

Every rank opens a TCPStore client with the world size (so it ADDs to
TCPStore's worker count "init/") and joins a gloo process group over it.
Then:

--mode id:      rank K (the hold-out, default 0) never sets KEY (default
                job7/nccl_id): it holds; every other rank blocks in
                store.get(KEY), as ranks waiting for rank 0's NCCL id do.
--mode barrier: every rank but K enters torch's store-based barrier
                (distributed_c10d._store_based_barrier, group NAME, default
                stuck); K holds.

Prints {"rank", "pid", "initialized"} once the group is up, then
{"rank", "waiting": ...} or {"rank", "holding": true}, and blocks until
killed (or a rank's wait ends, when it prints {"rank", "released": ...}).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from datetime import timedelta

warnings.filterwarnings("ignore")

import torch.distributed as dist  # noqa: E402
from torch.distributed import distributed_c10d  # noqa: E402


def emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", choices=["id", "barrier"], required=True)
    ap.add_argument("--key", default="job7/nccl_id")
    ap.add_argument("--group", default="stuck")
    ap.add_argument("--holdout", type=int, default=0)
    ap.add_argument("--timeout-s", type=float, default=900)
    a = ap.parse_args()
    timeout = timedelta(seconds=a.timeout_s)

    store = dist.TCPStore(a.host, a.port, world_size=a.world, is_master=False,
                          timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=a.rank, world_size=a.world,
                            timeout=timeout)
    emit({"rank": a.rank, "pid": os.getpid(), "initialized": True})

    if a.rank == a.holdout:
        emit({"rank": a.rank, "holding": True})
        while True:
            time.sleep(3600)
    if a.mode == "id":
        emit({"rank": a.rank, "waiting": a.key})
        value = store.get(a.key)
        emit({"rank": a.rank, "released": value.decode(errors="replace")})
    else:
        emit({"rank": a.rank, "waiting": "barrier " + a.group})
        distributed_c10d._store_based_barrier(a.rank, store, a.group, a.world, timeout)
        emit({"rank": a.rank, "released": "barrier " + a.group})
    return 0


if __name__ == "__main__":
    sys.exit(main())
