"""A parameter-server-style training loop (numpy only) that keeps training
across a coordinator restart.

The coordinator owns the weights of a linear model; every step it schedules
one gradient closure per data shard on the durable closure queue, joins, and
applies the mean gradient. Each closure returns ``(step, gradient)``. Since
closures and their results live in the coordstore cluster, a coordinator
started with ``--attach`` after the first one died rebuilds the weights by
replaying every recorded step (the update is deterministic), waits for the
closures of the step that was in flight, and goes on: no step is lost or
applied twice.

    coordstore serve &                                   # or a 3-node cluster
    python -m coordstore.worker --queue ps --endpoints 127.0.0.1:7470 &
    python -m coordstore.worker --queue ps --endpoints 127.0.0.1:7470 &
    python ps_training.py --endpoints 127.0.0.1:7470 --steps 200
    # kill it midway, then:
    python ps_training.py --endpoints 127.0.0.1:7470 --steps 200 --attach
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

import coordstore

FEATURES = 8
SHARDS = 4
LR = 0.1


def data(shard: int):
    """The shard's examples: fixed by its seed, the same on every worker."""
    rng = np.random.default_rng(1000 + shard)
    x = rng.normal(size=(256, FEATURES))
    w_true = np.arange(1, FEATURES + 1, dtype=float) / FEATURES
    y = x @ w_true + 0.01 * rng.normal(size=256)
    return x, y


def gradient(step: int, shard: int, w: np.ndarray):
    """Runs on a worker: the mean-squared-error gradient on one shard."""
    x, y = data(shard)
    err = x @ w - y
    return step, 2.0 * x.T @ err / len(y)


def loss(w: np.ndarray) -> float:
    return float(np.mean([np.mean((x @ w - y) ** 2) for x, y in map(data, range(SHARDS))]))


def replay(coord: coordstore.ClusterCoordinator) -> tuple[np.ndarray, int]:
    """The weights after every step the queue holds all results of, and the
    next step to schedule."""
    values = coord.scheduled()
    coord.join()
    grads: dict[int, list[np.ndarray]] = defaultdict(list)
    for step, g in coord.fetch(values):
        grads[step].append(g)
    w = np.zeros(FEATURES)
    step = 0
    while len(grads.get(step, [])) == SHARDS:
        w -= LR * np.mean(grads[step], axis=0)
        step += 1
    return w, step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoints", required=True, help="every node, HOST:PORT,...")
    p.add_argument("--queue", default="ps")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--attach", action="store_true", help="take over from a coordinator that died")
    a = p.parse_args()
    endpoints = a.endpoints.split(",")
    if a.attach:
        coord = coordstore.ClusterCoordinator.attach(endpoints, a.queue, tag="ps")
        w, start = replay(coord)
        print(f"attached: resuming at step {start}, loss {loss(w):.6f}", flush=True)
    else:
        coord = coordstore.ClusterCoordinator(endpoints, a.queue, tag="ps", lease=2.0)
        w, start = np.zeros(FEATURES), 0
    for step in range(start, a.steps):
        values = [coord.schedule(gradient, (step, s, w)) for s in range(SHARDS)]
        coord.join()
        grads = [g for _, g in coord.fetch(values)]
        w = w - LR * np.mean(grads, axis=0)
        print(f"step {step} loss {loss(w):.6f}", flush=True)
    print(f"done: {a.steps} steps, loss {loss(w):.6f}", flush=True)


if __name__ == "__main__":
    main()
