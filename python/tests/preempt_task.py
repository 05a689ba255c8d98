"""A task of test_preemption.py's job, counting steps until the preemption
sync point and printing `ready`, `counting` once its first step is counted,
then `sync STEP`.

    python preempt_task.py jax ADDRESS NUM_TASKS TASK_ID   # stock jaxlib
    python preempt_task.py py ENDPOINTS TASK_ID            # coordstore.Agent,
                                                           # SIGTERM notifier
"""

import os
import sys
import time


def steps(reached) -> None:
    for step in range(1_000_000):
        if reached(step):
            print(f"sync {step}", flush=True)
            return
        if step == 0:
            print("counting", flush=True)
        time.sleep(0.02)


if __name__ == "__main__":
    kind = sys.argv[1]
    if kind == "jax":
        import jax
        from jax.experimental import multihost_utils

        addr, n, pid = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        # Process 0's embedded service binds a throwaway port (it would take
        # the coordinator's address): every process uses coordstore's.
        jax.distributed.initialize(
            coordinator_address=addr,
            num_processes=n,
            process_id=pid,
            initialization_timeout=120,
            coordinator_bind_address="127.0.0.1:0",
        )
        print("ready", flush=True)
        steps(multihost_utils.reached_preemption_sync_point)
    else:
        import coordstore

        endpoints, task = sys.argv[2].split(","), int(sys.argv[3])
        agent = coordstore.Agent(endpoints, "jax_worker", task, heartbeat_interval=1.0)
        agent.connect()
        manager = coordstore.PreemptionSyncManager(agent, "sigterm")
        print("ready", flush=True)
        steps(manager.reached_sync_point)
    # The test only needs the step; leave without the shutdown barrier.
    os._exit(0)
