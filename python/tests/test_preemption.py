"""Preemption sync in one job of two stock-jaxlib tasks and two Python
tasks (coordstore.PreemptionSyncManager): a SIGTERM to one Python task
makes all four stop at the same step."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from conftest import wait_for

HERE = Path(__file__).resolve().parent


def test_python_and_jax_tasks_agree_on_one_sync_point(cluster_factory, procs):
    c = cluster_factory(3, ["--tasks", "4"])
    task = str(HERE / "preempt_task.py")
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
    out = dict(stdout=subprocess.PIPE, text=True, env=env)
    tasks = [procs.spawn(task, "jax", c.addrs[i], "4", str(i), **out) for i in range(2)]
    tasks += [procs.spawn(task, "py", ",".join(c.addrs), str(i), **out) for i in (2, 3)]
    for t in tasks:
        assert t.stdout.readline().strip() == "ready"
    for t in tasks:  # every task is counting steps
        assert t.stdout.readline().strip() == "counting"
    tasks[2].send_signal(signal.SIGTERM)
    lines = [t.stdout.readline().strip() for t in tasks]
    assert all(l.startswith("sync ") for l in lines), lines
    steps = {int(l.split()[1]) for l in lines}
    assert len(steps) == 1, f"the tasks stopped at different steps: {lines}"
    for t in tasks:
        wait_for("the task to exit", lambda: t.poll() is not None, 30)
        assert t.returncode == 0
