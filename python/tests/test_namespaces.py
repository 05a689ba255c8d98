"""Namespaces from Python: coordstore.Agent, ClusterCoordinator and
``python -m coordstore.worker`` each in a namespace of their own on one
cluster, reached by name on the main port, never meeting."""

from __future__ import annotations

import json
import math
import subprocess
import threading

import pytest

import coordstore
from coordstore import errors
from conftest import coordstore_bin, wait_for


def ctl(cluster, *args: str) -> dict:
    r = subprocess.run(
        [coordstore_bin(), "ctl", "--endpoint", cluster.addrs[0], *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def agents(cluster, namespace: str, n: int = 2):
    made = [coordstore.Agent(cluster.addrs, "worker", i, namespace=namespace) for i in range(n)]
    threads = [threading.Thread(target=a.connect) for a in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(a.state == "CONNECTED" for a in made)
    return made


def test_agents_in_two_namespaces_never_meet(cluster_factory):
    c = cluster_factory(1, ["--tasks", "1"])
    for name in ("job-a", "job-b"):
        created = ctl(c, "ns", "create", name, "--job", "worker=2")
        assert created["name"] == name
    a0, a1 = agents(c, "job-a")
    b0, b1 = agents(c, "job-b")
    a0.insert("cfg/lr", "0.1")
    b0.insert("cfg/lr", "0.2")
    assert a1.get("cfg/lr") == b"0.1"
    assert b1.get("cfg/lr") == b"0.2"
    assert a1.get_dir("cfg") == [("cfg/lr", b"0.1")]
    # The same barrier id: B's passes, A's task 0 is still waiting alone.
    waiting = threading.Thread(target=a0.barrier, args=("step", 60), daemon=True)
    waiting.start()
    wait_for("A's barrier to be pending", lambda: ctl(c, "ns", "get", "job-a")["barriers_pending"] == 1)
    t = threading.Thread(target=b0.barrier, args=("step", 60))
    t.start()
    b1.barrier("step", 60)
    t.join(60)
    assert ctl(c, "ns", "get", "job-a")["barriers_pending"] == 1
    a1.barrier("step", 60)
    waiting.join(60)
    assert not waiting.is_alive()
    got = ctl(c, "ns", "get", "job-b")
    assert got["tasks"]["connected"] == 2 and got["keys"] == 1
    # The default namespace saw none of it.
    assert ctl(c, "ns", "get", "default")["keys"] == 0


def test_an_agent_in_an_unknown_namespace_is_not_found(cluster_factory):
    c = cluster_factory(1, ["--tasks", "1"])
    a = coordstore.Agent(c.addrs, "jax_worker", 0, namespace="nope")
    with pytest.raises(errors.NotFound, match="nope"):
        a.connect()


def test_cluster_coordinators_and_workers_in_their_own_namespaces(cluster_factory, procs):
    c = cluster_factory(1, ["--tasks", "1"])
    ctl(c, "ns", "create", "train-a", "--tasks", "1")
    ctl(c, "ns", "create", "train-b", "--tasks", "1")
    # The same queue name in each namespace: two queues.
    ca = coordstore.ClusterCoordinator(c.addrs, "work", lease=2.0, namespace="train-a")
    cb = coordstore.ClusterCoordinator(c.addrs, "work", lease=2.0, namespace="train-b")
    in_a = [ca.schedule(math.factorial, (i,)) for i in range(5)]
    in_b = [cb.schedule(math.factorial, (10 + i,)) for i in range(3)]
    queues = ctl(c, "ns", "get", "train-a")["closure_queues"]
    assert [(q["name"], q["queued"]) for q in queues] == [("work", 5)]
    # A worker process for A only: B's closures stay queued.
    endpoints = ",".join(c.addrs)
    procs.spawn("-m", "coordstore.worker", "--queue", "work", "--endpoints", endpoints,
                "--name", "wa", "--namespace", "train-a")
    ca.join()
    assert ca.fetch(in_a) == [math.factorial(i) for i in range(5)]
    queued_b = ctl(c, "ns", "get", "train-b")["closure_queues"][0]["queued"]
    assert queued_b == 3
    procs.spawn("-m", "coordstore.worker", "--queue", "work", "--endpoints", endpoints,
                "--name", "wb", "--namespace", "train-b")
    cb.join()
    assert cb.fetch(in_b) == [math.factorial(10 + i) for i in range(3)]
