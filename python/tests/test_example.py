"""python/examples/ps_training.py keeps training across a coordinator
SIGKILL: the restarted coordinator resumes at the next step and ends with
the weights of an uninterrupted run."""

from __future__ import annotations

import subprocess
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ps_training.py"


def test_training_goes_on_after_the_coordinator_is_killed(cluster_factory, procs):
    c = cluster_factory(3)
    endpoints = ",".join(c.addrs)
    for i in range(2):
        procs.spawn("-m", "coordstore.worker", "--queue", "ps", "--endpoints", endpoints, "--name", f"w{i}")
    first = procs.spawn(str(EXAMPLE), "--endpoints", endpoints, "--steps", "40", stdout=subprocess.PIPE, text=True)
    seen = ""
    for seen in first.stdout:
        if seen.startswith("step 15 "):
            break
    assert seen.startswith("step 15 "), f"the first coordinator ended early: {seen!r}"
    first.kill()
    first.wait()
    second = subprocess.run(
        [procs.python, str(EXAMPLE), "--endpoints", endpoints, "--steps", "40", "--attach"],
        capture_output=True, text=True, timeout=300,
    )
    assert second.returncode == 0, second.stderr
    lines = second.stdout.splitlines()
    resumed = int(lines[0].split("resuming at step ")[1].split(",")[0])
    assert resumed >= 16, lines[0]
    # Every step after the resumed one, once, in order.
    steps = [int(l.split()[1]) for l in lines[1:] if l.startswith("step ")]
    assert steps == list(range(resumed, 40))
    # An uninterrupted run in memory reaches the same loss.
    import numpy as np
    import sys

    sys.path.insert(0, str(EXAMPLE.parent))
    import ps_training as ex

    w = np.zeros(ex.FEATURES)
    for step in range(40):
        w = w - ex.LR * np.mean([ex.gradient(step, s, w)[1] for s in range(ex.SHARDS)], axis=0)
    assert lines[-1] == f"done: 40 steps, loss {ex.loss(w):.6f}"
