#!/usr/bin/env python3
"""One stock TensorFlow 2.21 task whose coordination service leader is an
external server (coordstore), as `docs/protocols.md` describes (section
tensorflow.CoordinationService (TF 2.21 and the seed protocol)): the
service is listed in the ClusterSpec as its own job
(`coordinator`, or `ps` for MultiWorkerMirroredStrategy), and the task is a
pure agent of it.

Output: JSON lines {"check": NAME, "ok": BOOL, "detail": ...} on stdout (plus
bare marker lines such as READY); TensorFlow's logs go to stderr. Exit codes:
0 all good, 1 a check failed, 124 watchdog.

Scenarios (--scenario), run by every worker of the job at once:
  ops       devices of every task, KV, a reused barrier id that must wait for
            the late task again, GetTaskState, an end barrier.
  error     task 0 reports an error and prints REPORTED; every other task
            prints WAITING, and after a line on stdin must see its own agent
            in ERROR (a barrier call refused locally) within --learn-within-s;
            the source of the error is the push (ReportErrorToTask) or the
            heartbeat reply, whichever comes first.
  mwms      one MultiWorkerMirroredStrategy training step (service as job ps).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

_out_lock = threading.Lock()


def emit(obj: dict) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def marker(line: str) -> None:
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def start_watchdog(seconds: float) -> None:
    def fire() -> None:
        emit({"check": "watchdog", "ok": False, "detail": f"still running after {seconds} s"})
        os._exit(124)

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()


def short(exc: BaseException, limit: int = 400) -> str:
    s = str(exc).replace("\n", " | ")
    return s if len(s) <= limit else s[:limit] + "..."


class Task:
    def __init__(self, args):
        self.args = args
        self.k = args.task
        self.workers = args.workers.split(",")
        self.n = len(self.workers)
        self.failed: list[str] = []

    def check(self, name: str, fn, *a):
        t0 = time.monotonic()
        try:
            detail = fn(*a)
            ok = True
        except Exception as e:  # noqa: BLE001
            ok, detail = False, f"{type(e).__name__}: {short(e)}"
        if detail is None:
            detail = {}
        if isinstance(detail, dict):
            detail.setdefault("elapsed_ms", round((time.monotonic() - t0) * 1000, 1))
        emit({"check": name, "ok": ok, "detail": detail})
        if not ok:
            self.failed.append(name)
        return ok

    def finish(self) -> int:
        emit({"check": "summary", "ok": not self.failed,
              "detail": {"task": self.k, "failed": self.failed}})
        return 0 if not self.failed else 1

    # -- setup
    def cluster(self, leader_job: str) -> dict:
        return {"worker": self.workers, leader_job: [self.args.service]}

    def connect(self, leader_job: str):
        """configure_coordination_service + enable_collective_ops: registers
        the task and waits for all tasks (WaitForAllTasks)."""
        from tensorflow.core.protobuf import tensorflow_server_pb2
        from tensorflow.python.eager import context
        from tensorflow.python.training import server_lib

        ctx = context.context()
        ctx.configure_coordination_service(
            service_type="standalone",
            service_leader=f"/job:{leader_job}/replica:0/task:0",
            heartbeat_timeout_in_ms=self.args.heartbeat_timeout_ms,
            cluster_register_timeout_in_ms=60_000,
            shutdown_barrier_timeout_in_ms=30_000,
        )
        # As MultiWorkerMirroredStrategy does: the session config carries the
        # coordination config, and the server listens on the task's port.
        server_def = tensorflow_server_pb2.ServerDef(
            cluster=server_lib.ClusterSpec(self.cluster(leader_job)).as_cluster_def(),
            default_session_config=ctx.config,
            job_name="worker",
            task_index=self.k,
            protocol="grpc",
            port=int(self.workers[self.k].rsplit(":", 1)[1]),
        )
        ctx.enable_collective_ops(server_def)
        context.ensure_initialized()
        self.ctx = ctx
        return {"task": self.k}

    # -- ops
    def devices(self):
        import tensorflow as tf
        names = sorted(d.name for d in tf.config.list_logical_devices("CPU"))
        want = [f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(self.n)]
        missing = [w for w in want if w not in names]
        if missing:
            raise AssertionError(f"devices {names} lack {missing}")
        return {"cpus": names}

    def kv(self):
        ctx, k = self.ctx, self.k
        ctx.set_config_key_value(f"tf/kv/{k}", f"value-{k}")
        got = [ctx.get_config_key_value(f"tf/kv/{i}") for i in range(self.n)]
        if got != [f"value-{i}" for i in range(self.n)]:
            raise AssertionError(f"got {got}")
        return {"values": got}

    def reused_barrier(self):
        """The same id twice: the second use is a new instance that must
        wait for the late task again (TF 2.21 sends a per-id counter).
        Task 0 calls it first and announces when it got through; the others
        must not hear of that before they arrive themselves."""
        ctx, k = self.ctx, self.k
        ctx.wait_at_barrier("tf/reused", 60_000)
        if k == 0:
            ctx.set_config_key_value("tf/reused/entering", "1")
            ctx.wait_at_barrier("tf/reused", 60_000)
            ctx.set_config_key_value("tf/reused/passed", "1")
            return {}
        ctx.get_config_key_value("tf/reused/entering")
        try:
            ctx.get_config_key_value("tf/reused/passed", 3_000)
        except Exception as e:  # noqa: BLE001  (DeadlineExceeded: still waiting)
            if "timed out" not in str(e):
                raise
        else:
            raise AssertionError("task 0 passed the reused barrier before this task arrived")
        ctx.wait_at_barrier("tf/reused", 60_000)
        return {}

    def task_states(self):
        states = self.ctx.get_task_states([("worker", self.n)])
        if states != [None] * self.n:
            raise AssertionError(f"states {states!r}")
        return {"states": [repr(s) for s in states]}

    def run_ops(self) -> int:
        if not self.check("connect", self.connect, "coordinator"):
            return self.finish()
        self.check("devices", self.devices)
        self.check("kv", self.kv)
        self.check("reused_barrier", self.reused_barrier)
        self.check("task_states", self.task_states)
        if self.args.hold:
            # Connected, mid-job: the test changes other jobs meanwhile.
            marker("HOLDING")
            sys.stdin.readline()
        self.check("end_barrier", self.ctx.wait_at_barrier, "tf/end", 60_000)
        return self.finish()

    # -- error propagation
    def run_error(self) -> int:
        if not self.check("connect", self.connect, "coordinator"):
            return self.finish()
        ctx = self.ctx
        self.check("before_error", ctx.wait_at_barrier, "tf/before-error", 60_000)
        if self.k == 0:
            ok = self.check("report", ctx.report_error_to_cluster, 13, "task 0 failed on purpose")
            marker("REPORTED")
            # Stay up until told (the others learn of the error meanwhile).
            sys.stdin.readline()
            return self.finish() if ok else 1

        # Probe only once the error has been reported (the test says when).
        marker("WAITING")
        sys.stdin.readline()

        def learn():
            seen = set()
            t0 = time.monotonic()
            deadline = t0 + self.args.learn_within_s
            while time.monotonic() < deadline:
                try:
                    # Refused locally (FAILED_PRECONDITION) once the agent is in
                    # ERROR; before that it fails at the service at once,
                    # because task 0 is in ERROR (INTERNAL).
                    ctx.wait_at_barrier(f"tf/probe/{self.k}/{time.monotonic_ns()}", 100)
                except Exception as e:  # noqa: BLE001
                    msg = str(e)
                    seen.add(short(e, 300))
                    if "Agent must be in CONNECTED state. It is currently in ERROR" in msg:
                        return {"learned_after_s": round(time.monotonic() - t0, 2),
                                "error": short(e, 200)}
                time.sleep(0.05)
            raise AssertionError(f"agent not in ERROR after {self.args.learn_within_s} s: {sorted(seen)}")
        self.check("learned_error", learn)
        marker("LEARNED")
        return self.finish()

    # -- MultiWorkerMirroredStrategy
    def run_mwms(self) -> int:
        os.environ["TF_CONFIG"] = json.dumps({
            "cluster": self.cluster("ps"),
            "task": {"type": "worker", "index": self.k},
        })
        import numpy as np
        import tensorflow as tf

        def step():
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
            with strategy.scope():
                w = tf.Variable(1.0)
            opt_lr = 0.1

            @tf.function
            def train(x):
                def replica(x):
                    with tf.GradientTape() as tape:
                        loss = tf.reduce_mean((w * x - 2.0 * x) ** 2)
                    g = tape.gradient(loss, w)
                    g = tf.distribute.get_replica_context().all_reduce("mean", g)
                    w.assign_sub(opt_lr * g)
                    return loss
                return strategy.run(replica, args=(x,))

            x = tf.constant(np.arange(1.0, 5.0, dtype=np.float32))
            loss = float(strategy.reduce("mean", train(x), axis=None))
            return {"workers": strategy.extended._num_workers, "loss": loss,
                    "w": float(w.numpy())}
        self.check("mwms_step", step)
        return self.finish()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--service", required=True, help="host:port of the coordination service")
    p.add_argument("--workers", required=True, help="comma-separated host:port of every worker")
    p.add_argument("--task", type=int, required=True, help="this worker's index")
    p.add_argument("--scenario", choices=["ops", "error", "mwms"], required=True)
    p.add_argument("--heartbeat-timeout-ms", type=int, default=10_000)
    p.add_argument("--learn-within-s", type=float, default=20.0)
    p.add_argument("--deadline", type=float, default=240)
    p.add_argument("--hold", action="store_true",
                   help="ops: print HOLDING before the end barrier, go on after a line on stdin")
    args = p.parse_args(argv)
    start_watchdog(args.deadline)
    t = Task(args)
    rc = {"ops": t.run_ops, "error": t.run_error, "mwms": t.run_mwms}[args.scenario]()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
