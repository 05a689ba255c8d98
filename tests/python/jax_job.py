#!/usr/bin/env python3
"""One process of a real multi-process JAX job (CPU devices).

    jax_job.py --coordinator HOST:PORT --num-processes N --process-id K

Calls `jax.distributed.initialize` exactly as a stock JAX job does.  Process
0 still starts jax's embedded service, but by default binds it to
`127.0.0.1:0` (the "bind trick"), so every process, process 0 included, uses
the coordination service at --coordinator.  With --host-service process 0's
embedded service binds --coordinator itself (plain jax behaviour: the
reference service).

Then it checks process_count / devices, exchanges data through the KV store
(key_value_set + blocking_key_value_get of every peer), waits at a
coordination barrier, runs cross-process collectives (gloo over the KV store:
sync_global_devices, process_allgather, broadcast_one_to_all), asks for the
live nodes, and ends with `jax.distributed.shutdown()` (shutdown barrier).

Prints one line `{"check": "jax_job", "ok": BOOL, "detail": {...}}` and exits
0 iff everything held.  Bounded by --deadline.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jax_client import emit, error_code, short, start_watchdog  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--coordinator", required=True, help="coordination service host:port")
    p.add_argument("--num-processes", type=int, required=True)
    p.add_argument("--process-id", type=int, required=True)
    p.add_argument("--local-devices", type=int, default=2, help="CPU devices per process")
    p.add_argument("--host-service", action="store_true",
                   help="process 0 serves --coordinator itself (jax's built-in service)")
    p.add_argument("--namespace", default="coordstore-job", help="prefix of the job's own keys")
    p.add_argument("--init-timeout", type=int, default=60, help="initialization_timeout, s")
    p.add_argument("--heartbeat-timeout", type=int, default=100, help="heartbeat_timeout_seconds")
    p.add_argument("--shutdown-timeout", type=int, default=60, help="shutdown_timeout_seconds")
    p.add_argument("--timeout-ms", type=int, default=30000, help="KV get / barrier timeout")
    p.add_argument("--deadline", type=float, default=180, help="hard bound on the process, s")
    p.add_argument("--tag", default="", help="prefix of the values this job writes")
    p.add_argument("--hold-at-barrier", action="store_true",
                   help="print AT_BARRIER before the first barrier; a process other than 0 "
                        "enters it only after a line on stdin")
    args = p.parse_args()
    # Native code (gloo) prints to fd 1; keep stdout for our JSON line only
    # and send everything else written to fd 1 to stderr.
    sys.stdout.flush()
    json_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(json_fd, "w", buffering=1)
    start_watchdog(args.deadline)

    n, k, ns = args.num_processes, args.process_id, args.namespace.strip("/")
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("JAX_ENABLE_X64", "0")

    t0 = time.monotonic()
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", args.local_devices)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")

    detail: dict = {"process_id": k, "num_processes": n, "coordinator": args.coordinator,
                    "host_service": args.host_service}
    problems: list[str] = []
    timings: dict = {}

    def need(cond: bool, what: str) -> None:
        if not cond:
            problems.append(what)

    def step(name: str, fn):
        s = time.monotonic()
        try:
            r = fn()
        except Exception as e:  # noqa: BLE001
            problems.append(f"{name}: {type(e).__name__} [{error_code(e)}]: {short(e)}")
            r = None
        timings[name] = round((time.monotonic() - s) * 1000, 1)
        return r

    init_kw = dict(coordinator_address=args.coordinator, num_processes=n, process_id=k,
                   initialization_timeout=args.init_timeout,
                   heartbeat_timeout_seconds=args.heartbeat_timeout,
                   shutdown_timeout_seconds=args.shutdown_timeout)
    if k == 0:
        init_kw["coordinator_bind_address"] = args.coordinator if args.host_service else "127.0.0.1:0"
    s = time.monotonic()
    try:
        jax.distributed.initialize(**init_kw)
    except Exception as e:  # noqa: BLE001
        emit({"check": "jax_job", "ok": False,
              "detail": {**detail, "problems": [f"initialize: {type(e).__name__}: {short(e)}"]}})
        return 1
    timings["initialize"] = round((time.monotonic() - s) * 1000, 1)

    from jax._src import distributed as _dist
    client = _dist.global_state.client

    def devices():
        detail["process_count"] = jax.process_count()
        detail["process_index"] = jax.process_index()
        detail["devices"] = len(jax.devices())
        detail["local_devices"] = len(jax.local_devices())
        need(jax.process_count() == n, f"process_count {jax.process_count()} != {n}")
        need(jax.process_index() == k, f"process_index {jax.process_index()} != {k}")
        need(len(jax.local_devices()) == args.local_devices,
             f"local devices {len(jax.local_devices())} != {args.local_devices}")
        need(len(jax.devices()) == n * args.local_devices,
             f"global devices {len(jax.devices())} != {n * args.local_devices}")
        need(sorted({d.process_index for d in jax.devices()}) == list(range(n)),
             "devices do not span all processes")
    step("devices", devices)

    def kv_exchange():
        client.key_value_set(f"{ns}/pid/{k}", f"{args.tag}process-{k}")
        got = [client.blocking_key_value_get(f"{ns}/pid/{j}", args.timeout_ms) for j in range(n)]
        need(got == [f"{args.tag}process-{j}" for j in range(n)], f"kv exchange got {got}")
        listing = client.key_value_dir_get(f"{ns}/pid")
        need(len(listing) == n, f"dir_get returned {len(listing)} entries, want {n}")
        detail["kv_values"] = got
    step("kv_exchange", kv_exchange)

    if args.hold_at_barrier:
        sys.stdout.write("AT_BARRIER\n")
        sys.stdout.flush()
        if k != 0:
            sys.stdin.readline()
    step("barrier", lambda: client.wait_at_barrier(f"{ns}/barrier", args.timeout_ms))

    step("sync_global_devices", lambda: multihost_utils.sync_global_devices("coordstore-job-sync"))

    def allgather():
        g = multihost_utils.process_allgather(jnp.array([k, 10 * k], dtype=jnp.int32))
        g = np.asarray(g)
        detail["allgather"] = g.tolist()
        need(g.tolist() == [[j, 10 * j] for j in range(n)], f"process_allgather gave {g.tolist()}")
    step("process_allgather", allgather)

    def broadcast():
        v = multihost_utils.broadcast_one_to_all(jnp.full((3,), 100 + k, dtype=jnp.int32))
        need(np.asarray(v).tolist() == [100, 100, 100], f"broadcast_one_to_all gave {np.asarray(v).tolist()}")
    step("broadcast_one_to_all", broadcast)

    def live():
        nodes = client.get_live_nodes(list(range(n)))
        detail["live_nodes"] = sorted(nodes)
        need(sorted(nodes) == list(range(n)), f"live nodes {sorted(nodes)}")
    step("get_live_nodes", live)

    step("final_barrier", lambda: client.wait_at_barrier(f"{ns}/final", args.timeout_ms))
    step("shutdown", jax.distributed.shutdown)

    timings["total"] = round((time.monotonic() - t0) * 1000, 1)
    detail["timings_ms"] = timings
    detail["problems"] = problems
    emit({"check": "jax_job", "ok": not problems, "detail": detail})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if not problems else 1)


if __name__ == "__main__":
    sys.exit(main())
