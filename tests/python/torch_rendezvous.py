"""The cases of torch 2.15's own dynamic rendezvous tests
(``test/distributed/elastic/rendezvous/dynamic_rendezvous_test.py``:
``IntegrationTest`` and the handler tests that a real server can run) on
``--rdzv-backend coordstore``'s native handler against a real cluster.

Usage: torch_rendezvous.py ENDPOINTS (comma-separated HOST:PORT)

Each case prints ``ok <name>``; the first failure raises (exit status 1).
torch's tests make handlers with ``local_addr=127.0.0.{i}`` and
``join_timeout=5`` over an in-memory backend; here each handler is made the
way torchrun makes it (torch's registry, ``RendezvousParameters``), with its
own relay into the run's namespace.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from typing import Any, Callable

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousGracefulExitError,
    RendezvousParameters,
    RendezvousTimeoutError,
    rendezvous_handler_registry,
)

from coordstore.rendezvous import NativeRendezvousHandler

ENDPOINTS = sys.argv[1]


def handler(run: str, i: int, min_nodes: int, max_nodes: int, **conf: Any) -> NativeRendezvousHandler:
    conf.setdefault("join_timeout", "20")
    conf.setdefault("last_call_timeout", "1")
    params = RendezvousParameters(
        backend="coordstore",
        endpoint=ENDPOINTS,
        run_id=run,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        local_addr=f"127.0.0.{i + 1}",
        **{k: str(v) for k, v in conf.items()},
    )
    h = rendezvous_handler_registry.create_handler(params)
    assert isinstance(h, NativeRendezvousHandler), type(h)
    assert h.get_backend() == "coordstore"
    return h


def in_thread(f: Callable[[], Any]) -> Callable[[], Any]:
    """Runs ``f`` in a thread; the returned call joins it and gives its
    result (or raises what it raised)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = f()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def join(timeout: float = 60.0) -> Any:
        t.join(timeout)
        assert not t.is_alive(), "the thread did not end"
        if "error" in out:
            raise out["error"]
        return out["value"]

    return join


def wait_for(what: str, cond: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def place(h: NativeRendezvousHandler) -> int:
    return h._rdzv.view(*h.node)[3]


def fresh_run() -> str:
    return "rdzv-" + uuid.uuid4().hex[:12]


def test_all_nodes_join_rendezvous() -> None:
    run = fresh_run()
    hs = [handler(run, i, 2, 2) for i in range(2)]
    joins = [in_thread(h.next_rendezvous) for h in hs]
    infos = [j() for j in joins]
    # torch's order: 127.0.0.1 before 127.0.0.2.
    assert [i.rank for i in infos] == [0, 1], [i.rank for i in infos]
    assert all(i.world_size == 2 for i in infos)
    for h in hs:
        h.shutdown()


def test_redundancy_list() -> None:
    run = fresh_run()
    hs = [handler(run, i, 2, 2) for i in range(3)]
    [j() for j in [in_thread(h.next_rendezvous) for h in hs[:2]]]
    late = in_thread(hs[2].next_rendezvous)
    wait_for("the third node redundant", lambda: place(hs[2]) == 3)
    # Redundant nodes do not count as waiting: no re-rendezvous.
    time.sleep(1.1)
    assert hs[0].num_nodes_waiting() == 0
    # Closing the run lets the redundant node exit gracefully.
    hs[0].shutdown()
    try:
        late()
        raise AssertionError("the redundant node formed a round")
    except RendezvousGracefulExitError:
        pass
    for h in hs[1:]:
        h.shutdown()


def test_redundancy_transition_to_wait_list_then_join_rendezvous() -> None:
    run = fresh_run()
    conf = {"keep_alive_interval": 1, "keep_alive_max_attempt": 2}
    hs = [handler(run, i, 1, 2, **conf) for i in range(3)]
    [j() for j in [in_thread(h.next_rendezvous) for h in hs[:2]]]
    late = in_thread(hs[2].next_rendezvous)
    wait_for("the third node redundant", lambda: place(hs[2]) == 3)
    # Node 1 stops keeping alive (its agent died): the leader drops it, the
    # redundant node moves to the wait list, node 0 sees it waiting.
    hs[1]._stop_heartbeats()
    wait_for("a node waiting", lambda: hs[0].num_nodes_waiting() == 1)
    # torch's agent restarts on num_nodes_waiting > 0: a new round of two.
    again = hs[0].next_rendezvous()
    info = late()
    assert (again.world_size, info.world_size) == (2, 2)
    assert {again.rank, info.rank} == {0, 1}
    for h in hs:
        h.shutdown()


def test_use_agent_store_is_true_and_the_round_store_is_prefixed() -> None:
    run = fresh_run()
    h = handler(run, 0, 1, 1)
    assert h.use_agent_store is True
    info = h.next_rendezvous()
    assert info.bootstrap_store_info is not None
    assert info.bootstrap_store_info.master_addr == "127.0.0.1"
    info.store.set("dummy_key", "dummy_value")
    raw: TCPStore = h._store  # the agent's client of its relay
    assert raw.get(f"torch.rendezvous.{run}.0/dummy_key") == b"dummy_value"
    h.shutdown()


def test_next_rendezvous_moves_to_next_round_if_called_repeatedly() -> None:
    run = fresh_run()
    h = handler(run, 0, 1, 1)
    rounds = []
    for _ in range(3):
        info = h.next_rendezvous()
        rounds.append(info.store.get("coordstore/workers_store_emptied"))
        assert (info.rank, info.world_size) == (0, 1)
    raw: TCPStore = h._store
    for r in range(3):
        assert raw.check([f"torch.rendezvous.{run}.{r}/coordstore/workers_store_emptied"])
    h.shutdown()


def test_is_closed_set_closed_and_shutdown() -> None:
    run = fresh_run()
    a, b = handler(run, 0, 1, 2), handler(run, 1, 1, 2)
    a.next_rendezvous()
    assert not a.is_closed()
    b.set_closed()
    b.set_closed()  # can be called multiple times
    assert a.is_closed() and b.is_closed()
    try:
        b.next_rendezvous()
        raise AssertionError("joined a closed rendezvous")
    except RendezvousClosedError:
        pass
    assert a.shutdown() is True
    assert a.shutdown() is True  # can be called multiple times


def test_next_rendezvous_respects_the_requested_timeout() -> None:
    run = fresh_run()
    h = handler(run, 0, 3, 3, join_timeout=2)
    started = time.monotonic()
    try:
        h.next_rendezvous()
        raise AssertionError("a round of three formed with one node")
    except RendezvousTimeoutError:
        pass
    took = time.monotonic() - started
    assert 1.5 < took < 15, took
    # It took itself out of the round it could not complete.
    assert place(h) == 0
    h.shutdown()


def test_min_nodes_form_after_the_last_call() -> None:
    run = fresh_run()
    hs = [handler(run, i, 2, 3, last_call_timeout=1) for i in range(2)]
    started = time.monotonic()
    infos = [j() for j in [in_thread(h.next_rendezvous) for h in hs]]
    took = time.monotonic() - started
    assert all(i.world_size == 2 for i in infos)
    assert took >= 0.9, took
    for h in hs:
        h.shutdown()


CASES = [
    test_all_nodes_join_rendezvous,
    test_redundancy_list,
    test_redundancy_transition_to_wait_list_then_join_rendezvous,
    test_use_agent_store_is_true_and_the_round_store_is_prefixed,
    test_next_rendezvous_moves_to_next_round_if_called_repeatedly,
    test_is_closed_set_closed_and_shutdown,
    test_next_rendezvous_respects_the_requested_timeout,
    test_min_nodes_form_after_the_last_call,
]

if __name__ == "__main__":
    for case in CASES:
        case()
        print(f"ok {case.__name__}", flush=True)
    print("all ok", flush=True)
