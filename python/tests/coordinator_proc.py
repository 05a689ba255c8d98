"""A coordinator process of test_coordinator.py: attaches to QUEUE with tag
"coord", schedules N closures `work(i, LOGDIR)`, prints `scheduled N`,
joins, prints `joined` and waits to be killed.

    python coordinator_proc.py ENDPOINTS QUEUE N LOGDIR
"""

import os
import sys
import time

import coordstore


def work(i, logdir):
    # One line per run, in a file per worker process.
    with open(os.path.join(logdir, f"{os.getpid()}.log"), "a") as f:
        f.write(f"{i}\n")
    time.sleep(0.02)
    return i * i


if __name__ == "__main__":
    endpoints, queue, n, logdir = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    c = coordstore.ClusterCoordinator.attach(endpoints, queue, tag="coord")
    for i in range(n):
        c.schedule(work, (i, logdir))
    print(f"scheduled {n}", flush=True)
    c.join()
    print("joined", flush=True)
    time.sleep(3600)
