#!/usr/bin/env python3
"""A worker of a torchrun job (stock torch 2.15, gloo), for
tests/tests/torchrun.rs.

    torchrun ... torchrun_worker.py [--rounds K] [--crash-rank R --crash-file F]
                                    [--hold-file H]

init_process_group("gloo") from the environment torchrun (or an `env`
prefix) gives it (env://), then one line

    {"rank": R, "world": N, "attempt": A, "master": "ADDR:PORT", "agent_store": "True", ...}

and the key `torchrun_worker/<A>/<R>` set through the process group's own
store (so a test finds every worker's key in the store it used), then K
rounds of all-reducing rank + 1 (the sum must be N(N+1)/2), a barrier, and a
last line {"done": {...}, "ok": BOOL}; exits 0 only if every check held.

--crash-rank R --crash-file F: the job's attempt A is 1 if the file F
exists when the worker starts, else 0; in attempt 0, global rank R waits
until every worker of the attempt has set its key (so every one printed its
line: gloo's init returning on rank R does not mean the others' full-mesh
connect finished), then makes F and exits with status 3 before the
all-reduces. Its agent
then restarts the worker group (--max-restarts) and the agents rendezvous
again. (TORCHELASTIC_RESTART_COUNT cannot tell the attempt: it counts the
agent's own restarts, and an agent that restarts because another node waits
does not count that one.)
--hold-file H: rank 0 waits for the file H to exist before the all-reduces
(the others wait in the first all-reduce), so a test can look at the
running job.

Every worker dies with the agent that started it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
import warnings
from datetime import timedelta

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def emit(obj: dict) -> None:
    # One write of the whole line: the node's workers share their agent's
    # stdout (a pipe: a write of up to 4 KiB is not interleaved).
    os.write(1, (json.dumps(obj) + "\n").encode())


def die_with_agent() -> None:
    """SIGKILLed when the agent that started this worker dies (a test that
    kills its torchrun leaves no worker behind)."""
    agent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != agent:
        os._exit(1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--crash-rank", type=int, default=-1)
    ap.add_argument("--crash-file", default="")
    ap.add_argument("--hold-file", default="")
    ap.add_argument("--timeout-s", type=float, default=120)
    a = ap.parse_args()
    die_with_agent()

    attempt = 1 if a.crash_file and os.path.exists(a.crash_file) else 0
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo", init_method="env://",
                            timeout=timedelta(seconds=a.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    emit({
        "rank": rank,
        "world": world,
        "attempt": attempt,
        "restart": restart,
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "group_rank": int(os.environ["GROUP_RANK"]),
        "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
        "pid": os.getpid(),
        "agent_pid": os.getppid(),
    })
    store = dist.distributed_c10d._get_default_store()
    store.set(f"torchrun_worker/{attempt}/{rank}", str(os.getpid()))

    if rank == a.crash_rank and attempt == 0 and a.crash_file:
        store.wait([f"torchrun_worker/0/{r}" for r in range(world)],
                   timedelta(seconds=a.timeout_s))
        open(a.crash_file, "x").close()
        emit({"rank": rank, "crashing": True})
        os._exit(3)
    if rank == 0 and a.hold_file:
        while not os.path.exists(a.hold_file):
            time.sleep(0.05)

    ok = True
    want = world * (world + 1) / 2
    for r in range(a.rounds):
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        ok &= t.item() == want
        emit({"rank": rank, "round": r, "sum": t.item()})
    dist.barrier()
    emit({"done": {"rank": rank, "world": world, "attempt": attempt}, "ok": ok})
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
