#!/usr/bin/env python3
"""Stock TensorFlow 2.21 tf.data service workers and clients against a
dispatcher (coordstore, or TF's own for comparison).

  worker  --dispatcher HOST:PORT [--port P]
          a WorkerServer; prints READY once registered, runs until stdin closes.
  client  --dispatcher HOST:PORT --scenario NAME[,NAME...] --workers W [--n N]
          reads with distribute() / register_dataset / from_dataset_id and
          checks the multiset of elements it got.

Scenarios (range(N) read through the service with W workers, sharding OFF):
  off        one epoch: every element W times.
  epochs     the same distributed dataset read twice: each epoch every
             element W times (repetitions 1 and 2).
  named      two clients of one named job, reading at once: together every
             element W times.
  register   register_dataset + from_dataset_id: every element W times.
  dynamic    DYNAMIC sharding of range(N) and from_tensor_slices: every
             element once.
  rr         coordinated reads (num_consumers=2) of an infinite dataset:
             consumer c's j-th element is 2 * (j // 2) + c.
  rr-join    coordinated reads while the test adds a worker: every round,
             consumer 1's element is consumer 0's plus one.
  data       static DATA sharding over the dispatcher's worker list: every
             element once.
  slow       one epoch read at 20 elements/s, printing READING after the
             first element and NEAR_END at 90%: every element W times; a
             "stall" line gives the longest wait for an element and the wait
             from the last element to the epoch's end.
  first      eleven fresh jobs, each read to its end: a "first" line gives
             the time from distribute() to the first element (p50 and max
             of the last ten).
  slow-restart  as slow while a worker restarts: every element W times plus
             one repeat of a prefix.
  held       DYNAMIC sharding of range(N): reads half, prints HALF, reads
             the rest after a line on stdin: every element once.

Output: JSON lines {"check": NAME, "ok": BOOL, "detail": ...} and a final
{"check": "summary", ...}; exit 0 when every check passed.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time

checks: list[bool] = []


def check(name: str, ok: bool, detail=None) -> None:
    checks.append(ok)
    print(json.dumps({"check": name, "ok": ok, "detail": detail}), flush=True)


def expect(name: str, got: list[int], n: int, times: int) -> None:
    want = collections.Counter({i: times for i in range(n)})
    have = collections.Counter(got)
    detail = None if have == want else {
        "missing": sorted((want - have).elements())[:20],
        "extra": sorted((have - want).elements())[:20],
        "count": len(got),
    }
    check(name, have == want, detail)


def worker(args) -> None:
    import tensorflow as tf

    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=args.dispatcher,
        port=args.port,
        heartbeat_interval_ms=args.heartbeat_ms,
    )
    server = tf.data.experimental.service.WorkerServer(config)
    print("READY", flush=True)
    sys.stdin.read()
    server.stop() if hasattr(server, "stop") else None


def run_scenario(scenario: str, service: str, n: int, w: int, dsvc, read) -> None:
    import tensorflow as tf

    if scenario == "off":
        ds = tf.data.Dataset.range(n).apply(
            dsvc.distribute(processing_mode="parallel_epochs", service=service)
        )
        expect("off", read(ds), n, w)
    elif scenario == "epochs":
        ds = tf.data.Dataset.range(n).apply(
            dsvc.distribute(processing_mode="parallel_epochs", service=service)
        )
        expect("epoch 1", read(ds), n, w)
        expect("epoch 2", read(ds), n, w)
    elif scenario == "named":
        got: list[list[int]] = [[], []]

        def one(i: int) -> None:
            ds = tf.data.Dataset.range(n).apply(
                dsvc.distribute(
                    processing_mode="parallel_epochs", service=service, job_name="shared"
                )
            )
            got[i] = read(ds)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        expect("named job shared by two clients", got[0] + got[1], n, w)
    elif scenario == "register":
        dataset_id = dsvc.register_dataset(service, tf.data.Dataset.range(n))
        ds = dsvc.from_dataset_id(
            processing_mode="parallel_epochs",
            service=service,
            dataset_id=dataset_id,
            element_spec=tf.TensorSpec(shape=(), dtype=tf.int64),
        )
        expect("register + from_dataset_id", read(ds), n, w)
    elif scenario == "dynamic":
        # DYNAMIC sharding: the workers pull splits from the dispatcher;
        # every element exactly once across them.
        ds = tf.data.Dataset.range(n).map(lambda x: x * 3).apply(
            dsvc.distribute(processing_mode="distributed_epoch", service=service)
        )
        expect("DYNAMIC range", [x // 3 for x in read(ds)], n, 1)
        slices = tf.data.Dataset.from_tensor_slices(list(range(n))).apply(
            dsvc.distribute(processing_mode="distributed_epoch", service=service)
        )
        expect("DYNAMIC from_tensor_slices", read(slices), n, 1)
    elif scenario == "rr":
        # Coordinated reads: two consumers of an infinite dataset read round
        # by round from the same worker; with every worker producing
        # 0, 1, 2, ..., consumer c's j-th element is 2 * (j // 2) + c.
        got: list[list[int]] = [[], []]

        def consume(c: int) -> None:
            ds = tf.data.Dataset.range(1 << 40).repeat().apply(
                dsvc.distribute(
                    processing_mode="parallel_epochs",
                    service=service,
                    job_name="coordinated",
                    consumer_index=c,
                    num_consumers=2,
                )
            )
            it = iter(ds)
            got[c] = [int(next(it)) for _ in range(n)]

        threads = [threading.Thread(target=consume, args=(c,)) for c in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for c in range(2):
            want = [2 * (j // 2) + c for j in range(n)]
            check(f"coordinated reads, consumer {c}", got[c] == want, {"got": got[c][:12]})
    elif scenario == "rr-join":
        # Coordinated reads while a worker joins (the test starts it after
        # READING): every round, both consumers read from the same worker,
        # so consumer 1's element is consumer 0's plus one, before and after
        # the new worker's pending task is promoted.
        got: list[list[int]] = [[], []]

        def consume(c: int) -> None:
            ds = tf.data.Dataset.range(1 << 40).repeat().apply(
                dsvc.distribute(
                    processing_mode="parallel_epochs",
                    service=service,
                    job_name="coordinated",
                    consumer_index=c,
                    num_consumers=2,
                )
            )
            it = iter(ds)
            for j in range(n):
                got[c].append(int(next(it)))
                if c == 0 and j == 0:
                    print("READING", flush=True)
                # 10 rounds/s: the joining worker's pending task is promoted
                # well before the reads end, even on a slow machine.
                time.sleep(0.1)

        threads = [threading.Thread(target=consume, args=(c,)) for c in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        pairs_ok = all(b == a + 1 for a, b in zip(got[0], got[1]))
        check(
            "coordinated reads across a joining worker",
            pairs_ok and len(got[0]) == len(got[1]) == n,
            {"first": got[0][:6], "last": got[0][-6:], "last1": got[1][-6:]},
        )
    elif scenario == "data":
        # Static DATA sharding: worker i reads every element whose index is
        # i modulo the workers; together every element once.
        ds = tf.data.Dataset.range(n).apply(
            dsvc.distribute(processing_mode=dsvc.ShardingPolicy.DATA, service=service)
        )
        expect("static DATA sharding", read(ds), n, 1)
    elif scenario == "slow":
        # Read slowly, announcing the first element (the test kills the
        # leader then); the epoch must still deliver every element.
        ds = tf.data.Dataset.range(n).apply(
            dsvc.distribute(processing_mode="parallel_epochs", service=service)
        )
        got = []
        stamps = [time.monotonic()]
        for x in ds:
            got.append(int(x))
            stamps.append(time.monotonic())
            if len(got) == 1:
                print("READING", flush=True)
            if len(got) == (9 * n * w) // 10:
                print("NEAR_END", flush=True)
            time.sleep(0.05)
        ended = time.monotonic()
        # The longest wait for the next element (the pacing sleep excluded),
        # and from the last element to the epoch's end.
        gaps = [b - a - 0.05 for a, b in zip(stamps[1:], stamps[2:])] or [0.0]
        expect("slow epoch across a leader kill", got, n, w)
        print(
            json.dumps(
                {
                    "check": "stall",
                    "ok": True,
                    "detail": {
                        "max_gap_s": round(max(gaps), 3),
                        "end_s": round(ended - stamps[-1] - 0.05, 3),
                        # Wall clock, to line up with the nodes' logs.
                        "last_element_at": round(time.time() - (time.monotonic() - stamps[-1]), 3),
                        "ended_at": round(time.time() - (time.monotonic() - ended), 3),
                    },
                }
            ),
            flush=True,
        )
    elif scenario == "held":
        # Half the epoch, a pause the test decides the end of, the rest.
        ds = tf.data.Dataset.range(n).apply(
            dsvc.distribute(processing_mode=dsvc.ShardingPolicy.DYNAMIC, service=service)
        )
        got = []
        for x in ds:
            got.append(int(x))
            if len(got) == n // 2:
                print("HALF", flush=True)
                sys.stdin.readline()
        expect("held DYNAMIC epoch", got, n, 1)
    elif scenario == "slow-restart":
        # As `slow`, while the test SIGKILLs worker 0 and restarts it on its
        # port: the restarted worker runs its task again from the start, so
        # the epoch holds every element W times plus a repeat of a prefix
        # (what the client had read from the killed worker).
        ds = tf.data.Dataset.range(n).apply(
            dsvc.distribute(processing_mode="parallel_epochs", service=service)
        )
        got = []
        for x in ds:
            got.append(int(x))
            if len(got) == 1:
                print("READING", flush=True)
            time.sleep(0.05)
        have = collections.Counter(got)
        extra = sorted(e for e, c in have.items() if c > w)
        ok = (
            all(w <= have[i] <= w + 1 for i in range(n))
            and set(have) == set(range(n))
            and extra == list(range(len(extra)))
        )
        check("epoch across a worker restart", ok, {"extra": extra, "count": len(got)})
    elif scenario == "first":
        # Time from distribute() to the first element, over 11 fresh
        # (anonymous) jobs: the first is a warm-up (graph tracing), the
        # other ten are timed; each epoch is read to its end.
        times = []
        for k in range(11):
            started = time.monotonic()
            ds = tf.data.Dataset.range(n).apply(
                dsvc.distribute(processing_mode="parallel_epochs", service=service)
            )
            it = iter(ds)
            first = int(next(it))
            if k:
                times.append(time.monotonic() - started)
            rest = [first] + [int(x) for x in it]
            expect(f"first element, job {k}", rest, n, w)
        times.sort()
        print(
            json.dumps(
                {
                    "check": "first",
                    "ok": True,
                    "detail": {
                        "p50_s": round(times[len(times) // 2], 4),
                        "max_s": round(times[-1], 4),
                    },
                }
            ),
            flush=True,
        )
    else:
        raise SystemExit(f"unknown scenario {scenario}")


def client(args) -> None:
    import tensorflow as tf

    service = f"grpc://{args.dispatcher}"
    n, w = args.n, args.workers
    dsvc = tf.data.experimental.service

    def read(ds) -> list[int]:
        return [int(x) for x in ds]

    started = time.monotonic()
    for scenario in args.scenario.split(","):
        run_scenario(scenario, service, n, w, dsvc, read)
    ok = all(checks)
    print(
        json.dumps(
            {
                "check": "summary",
                "ok": ok,
                "detail": {"seconds": round(time.monotonic() - started, 2)},
            }
        ),
        flush=True,
    )
    sys.exit(0 if ok else 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["worker", "client"])
    ap.add_argument("--dispatcher", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--heartbeat-ms", type=int, default=30_000)
    ap.add_argument("--scenario", default="off")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--deadline", type=float, default=240)
    args = ap.parse_args()
    # A watchdog: a hang is a failure with a clear exit code, not a stuck test.
    def watchdog() -> None:
        import faulthandler
        import os

        print(json.dumps({"check": "watchdog", "ok": False}), flush=True)
        faulthandler.dump_traceback(all_threads=True)
        os._exit(124)

    timer = threading.Timer(args.deadline, watchdog)
    timer.daemon = True
    if args.role == "client":
        timer.start()
        client(args)
    else:
        worker(args)


if __name__ == "__main__":
    main()
