"""coordstore.Agent against a real 3-node cluster: the KV store, errors by
class, watches, error reporting, and a blocking get and a barrier that ride
through a leader SIGKILL."""

from __future__ import annotations

import threading

import pytest

import coordstore
from coordstore import errors
from conftest import wait_for


def connected(cluster, n=2, **kw):
    agents = [coordstore.Agent(cluster.addrs, "worker", i, **kw) for i in range(n)]
    threads = [threading.Thread(target=a.connect) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(a.state == "CONNECTED" for a in agents)
    return agents


class Call(threading.Thread):
    """A blocking call in a thread; ``result()`` re-raises its error."""

    def __init__(self, fn, *args):
        super().__init__(daemon=True)
        self.fn, self.args, self.value, self.error = fn, args, None, None
        self.start()

    def run(self):
        try:
            self.value = self.fn(*self.args)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def result(self, timeout=60):
        self.join(timeout)
        assert not self.is_alive(), f"{self.fn.__name__} did not return within {timeout}s"
        if self.error is not None:
            raise self.error
        return self.value


def test_kv_calls_and_their_errors(cluster_factory):
    c = cluster_factory(3, ["--job", "worker=2"])
    a, _ = connected(c)
    a.insert("cfg/lr", "0.1")
    a.insert("cfg/steps", b"100")
    assert a.get("cfg/lr") == b"0.1"
    assert a.try_get("cfg/none") is None
    assert a.get_dir("cfg") == [("cfg/lr", b"0.1"), ("cfg/steps", b"100")]
    with pytest.raises(errors.AlreadyExists):
        a.insert("cfg/lr", "0.2")
    a.update("cfg/lr", "0.2")
    assert a.get("cfg/lr") == b"0.2"
    with pytest.raises(errors.DeadlineExceeded) as e:
        a.get("never", timeout=0.2)
    assert isinstance(e.value, errors.CoordstoreError) and e.value.code == 4
    assert a.increment("cfg/count") == 1
    assert a.increment("cfg/count", 41) == 42
    assert a.get("cfg/count") == b"42"
    with pytest.raises(errors.FailedPrecondition):
        a.increment("cfg/lr", 1)
    a.delete("cfg")
    assert a.get_dir("cfg") == []
    with pytest.raises(ValueError):
        a.get("k", timeout=-1)


def test_a_blocking_get_rides_through_a_leader_kill(cluster_factory):
    c = cluster_factory(3, ["--job", "worker=2"])
    a, b = connected(c)
    get = Call(a.get, "late/key", 120)
    wait_for("the get to be parked", lambda: c.parked() >= 1)
    leader = c.leader()
    c.kill(leader)
    c.leader([i for i in range(3) if i != leader])
    b.insert("late/key", "here")
    assert get.result() == b"here"


def test_a_barrier_rides_through_a_leader_kill(cluster_factory):
    c = cluster_factory(3, ["--job", "worker=2"])
    a, b = connected(c)
    first = Call(a.barrier, "checkpoint", 120.0)
    wait_for("the barrier to be parked", lambda: c.parked() >= 1)
    leader = c.leader()
    c.kill(leader)
    second = Call(b.barrier, "checkpoint", 120.0)
    first.result()
    second.result()
    # A subset barrier and a cancelled one.
    a.barrier("pair", 30.0, [("worker", 0)])
    waiting = Call(b.barrier, "cancelled", 60.0)
    wait_for("the barrier to be parked", lambda: c.parked() >= 1)
    a.cancel_barrier("cancelled")
    with pytest.raises(errors.CoordstoreError):
        waiting.result()


def test_watch_yields_every_change_in_order(cluster_factory):
    c = cluster_factory(3, ["--job", "worker=2"])
    a, b = connected(c)
    with a.watch("w/") as w:
        for i in range(5):
            b.insert(f"w/{i}", str(i))
        b.delete("w/0")
        got = [w.next(30) for _ in range(6)]
        assert got == [(f"w/{i}", str(i).encode()) for i in range(5)] + [("w/0", None)]
        assert w.next(0.2) is None


def test_an_error_reported_enters_error_and_calls_back(cluster_factory):
    c = cluster_factory(3, ["--job", "worker=2"])
    seen: list[errors.CoordstoreError] = []
    got = threading.Event()

    def on_error(e):
        seen.append(e)
        got.set()

    a, _ = connected(c, on_error=on_error)
    a.report_error(9, "disk full")
    assert got.wait(30)
    assert isinstance(seen[0], errors.FailedPrecondition)
    assert "disk full" in str(seen[0])
    assert a.state == "ERROR"
    a.reset()
    assert a.state == "DISCONNECTED"
