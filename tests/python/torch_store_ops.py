#!/usr/bin/env python3
"""Differential op script for PyTorch's c10d TCPStore wire protocol.

Drives stock `torch.distributed.TCPStore(host, port, is_master=False)`
clients (torch 2.15, venv from scripts/setup-torch.sh) against an EXISTING
server and prints one JSON line per op result on stdout:

    {"op": NAME, "result": <value, or {"error": CLASS, "msg": MESSAGE}>}

then a final {"summary": {...}} line, and exits 0. The output contains no
addresses, ports, timings or run ids, so running it against torch's own
server and against another server gives byte-identical output when the
other server behaves like torch's libuv server. Compare the two stdouts.

    python torch_store_ops.py --host H --port P [--prefix NAME]
    python torch_store_ops.py --self-host      # torch's own libuv server,
                                               # in-process, free loopback port

Every key lives under "<prefix>/<run-id>/" (run id random unless --run-id),
so the script can run repeatedly against a long-lived server; num_keys is
reported as a delta and list_keys is filtered to that namespace. Bytes are
shown as Python bytes literals. Network errors (the server closed the
connection) are reported by class only, because their text ("Connection
reset by peer", "Broken pipe", "got 0 bytes") depends on timing.

A blocking call is known to have been SENT without sleeping: its thread is
seen inside poll(2) in /proc/self/task/<tid>/syscall, which the client enters
only after it has written its WAIT (or BARRIER) request. That the server has
PARKED it cannot be observed for WAIT (it has no side effect), and a relay or
proxy between client and server adds hops the client cannot see, so after
the client is seen in poll(2) the script waits --settle-ms (default 100 ms)
before the write that should wake it. Only two results depend on that order
(cas_missing_wakes_waiters, queue_push_wakes_one); the rest come out the same
either way. Barriers need no settling: their counter key shows each parked
arrival. Where /proc cannot tell (not Linux x86_64/aarch64) a 0.3 s sleep
stands in, counted in the summary. One-sided checks ("still blocked") wait
briefly: a correct server always passes them, a wrong one almost always
fails them.

Exit codes: 0 completed (whatever the results), 2 could not connect, 124
watchdog (--deadline, default 180 s).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import re
import sys
import threading
import time
import warnings
from datetime import timedelta

warnings.filterwarnings("ignore")  # torch warns about a missing numpy on import

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

MIB = 1024 * 1024
_out_lock = threading.Lock()
_lines: list[str] = []
_sleep_fallbacks = 0
_settle_s = 0.1


def emit(obj: dict) -> None:
    line = json.dumps(obj, sort_keys=True, ensure_ascii=True)
    with _out_lock:
        _lines.append(line)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def start_watchdog(seconds: float) -> None:
    def fire() -> None:
        emit({"summary": {"watchdog": True, "deadline_s": seconds}})
        os._exit(124)

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()


# --------------------------------------------------------------------------
# result normalisation


class Runner:
    def __init__(self, ns: str) -> None:
        self.ns = ns  # "<prefix>/<run-id>" (user-level, without TCPStore's "/")
        self.count = 0

    def enc(self, v):
        if isinstance(v, bytes):
            return repr(v.replace(self.ns.encode(), b"<ns>"))
        if isinstance(v, str):
            return v.replace(self.ns, "<ns>")
        if isinstance(v, (list, tuple)):
            return [self.enc(x) for x in v]
        if isinstance(v, dict):
            return {str(k): self.enc(x) for k, x in v.items()}
        if isinstance(v, timedelta):
            return f"{v.total_seconds()}s"
        return v

    def exc(self, e: BaseException) -> dict:
        cls = type(e).__name__
        if isinstance(e, dist.DistNetworkError):
            return {"error": cls}
        msg = str(e).splitlines()[0] if str(e) else ""
        msg = msg.replace(self.ns, "<ns>")
        msg = re.sub(r"\[?[0-9a-fA-F:.]*\]?:\d{2,5}\b", "<addr>", msg)
        msg = re.sub(r"\bfd=\d+", "fd=<n>", msg)
        return {"error": cls, "msg": msg}

    def op(self, name: str, fn):
        """Run fn(); emit its (encoded) result or normalised exception."""
        try:
            res = self.enc(fn())
        except Exception as e:  # noqa: BLE001 - every outcome is a result
            res = self.exc(e)
        self.count += 1
        emit({"op": name, "result": res})
        return res

    @staticmethod
    def do(fn):
        """A step whose outcome shows in a later op; a failure is not fatal."""
        try:
            return fn()
        except Exception:  # noqa: BLE001
            return None

    def result(self, name: str, value) -> None:
        self.count += 1
        emit({"op": name, "result": self.enc(value)})


# --------------------------------------------------------------------------
# parked-call detection

_POLL_SYSCALLS = {"x86_64": {"7", "271"}, "aarch64": {"73"}}.get(platform.machine(), set())


class Waiter:
    """Runs one blocking store call in a thread and captures its outcome."""

    def __init__(self, runner: Runner, fn) -> None:
        self.runner = runner
        self.fn = fn
        self.tid = None
        self.outcome = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(5)

    def _run(self) -> None:
        self.tid = threading.get_native_id()
        self.ready.set()
        try:
            self.outcome = self.runner.enc(self.fn())
        except Exception as e:  # noqa: BLE001
            self.outcome = self.runner.exc(e)

    def parked(self, timeout: float = 10.0, settle: bool = True) -> bool:
        """True once the thread sits in poll(2), i.e. its WAIT was sent, and
        then --settle-ms have passed for it to cross any relay and park."""
        ok = self._sent(timeout)
        if settle:
            time.sleep(_settle_s)
        return ok

    def _sent(self, timeout: float) -> bool:
        global _sleep_fallbacks
        path = f"/proc/self/task/{self.tid}/syscall"
        if not _POLL_SYSCALLS or not os.path.exists(path):
            # No way to see the client's state: give the request time to
            # reach the server. Counted in the summary.
            _sleep_fallbacks += 1
            time.sleep(0.3)
            return self.thread.is_alive()
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self.thread.is_alive():
                return False
            try:
                with open(path) as f:
                    if f.read().split(" ", 1)[0] in _POLL_SYSCALLS:
                        return True
            except OSError:
                pass
            time.sleep(0.001)
        return False

    def still_blocked(self, grace: float = 0.2) -> bool:
        self.thread.join(grace)
        return self.thread.is_alive()

    def join(self, timeout: float = 30.0):
        self.thread.join(timeout)
        return self.outcome if not self.thread.is_alive() else "still blocked"


# --------------------------------------------------------------------------
# the op script


def run_script(host: str, port: int, ns: str, timeout_s: float, use_libuv: bool) -> Runner:
    r = Runner(ns)
    T = timedelta(seconds=timeout_s)

    def client(t: timedelta = T) -> dist.TCPStore:
        return dist.TCPStore(host, port, is_master=False, timeout=t, use_libuv=use_libuv)

    def k(name: str) -> str:
        return f"{ns}/{name}"

    try:
        c1 = client()
    except Exception as e:  # noqa: BLE001
        emit({"op": "connect", "result": r.exc(e)})
        emit({"summary": {"ops": 1, "connected": False}})
        sys.exit(2)
    c2 = r.do(client)
    r.result("connect", {"has_extended_api": c1.has_extended_api(), "client_libuv": c1.libuvBackend,
                         "timeout": c1.timeout})
    base_keys = r.do(c1.num_keys) or 0

    def num_keys_delta():
        return c1.num_keys() - base_keys

    # ---- set / get
    r.op("set_binary", lambda: c1.set(k("a"), b"\x00\x01bin\xff\x80"))
    r.op("get_binary", lambda: c1.get(k("a")))
    r.op("get_other_client", lambda: c2.get(k("a")))
    r.op("set_overwrite", lambda: c1.set(k("a"), b"second"))
    r.op("get_after_overwrite", lambda: c2.get(k("a")))
    r.op("set_empty_value", lambda: c1.set(k("empty"), b""))
    r.op("get_empty_value", lambda: c1.get(k("empty")))
    r.op("check_empty_value_key", lambda: c1.check([k("empty")]))
    r.op("set_str_value_utf8", lambda: c1.set(k("s"), "h\u00e9llo \u2603"))
    r.op("get_str_value_utf8", lambda: c1.get(k("s")))
    rnd = random.Random(1234)
    big = bytes(rnd.getrandbits(8) for _ in range(MIB + 17))
    r.op("set_1MiB", lambda: c1.set(k("big"), big))
    r.op("get_1MiB", lambda: (lambda v: {"len": len(v), "sha256": hashlib.sha256(v).hexdigest()})(c2.get(k("big"))))
    max_val = bytes(range(256)) * (8 * MIB // 256)
    r.op("set_8MiB_exact", lambda: c1.set(k("max"), max_val))
    r.op("get_8MiB_exact", lambda: (lambda v: {"len": len(v), "sha256": hashlib.sha256(v).hexdigest()})(c2.get(k("max"))))
    r.op("delete_8MiB", lambda: c1.delete_key(k("max")))
    # On the wire every key is "/" + key; the server accepts at most 8192 bytes.
    long_ok = k("L") + "x" * (8191 - len(k("L")))
    r.op("set_key_wire_8192_bytes", lambda: c1.set(long_ok, b"long"))
    r.op("get_key_wire_8192_bytes", lambda: c2.get(long_ok))
    r.op("delete_key_wire_8192_bytes", lambda: c1.delete_key(long_ok))

    # ---- timeouts on blocking reads
    c3 = client(timedelta(milliseconds=250))
    r.op("store_timeout_property", lambda: c3.timeout)
    r.op("get_missing_times_out", lambda: c3.get(k("missing")))
    r.op("connection_usable_after_timeout", lambda: (c3.set(k("t"), b"1"), c3.get(k("t")))[1])
    r.op("wait_present", lambda: c1.wait([k("a")]))
    r.op("wait_empty_list", lambda: c1.wait([]))
    r.op("wait_missing_times_out", lambda: c1.wait([k("a"), k("m1"), k("m2")], timedelta(milliseconds=150)))
    c3.set_timeout(timedelta(milliseconds=120))
    r.op("set_timeout_applies", lambda: c3.get(k("missing")))
    r.op("set_timeout_property", lambda: c3.timeout)

    # ---- check
    r.op("check_present", lambda: c1.check([k("a")]))
    r.op("check_mixed", lambda: c1.check([k("a"), k("missing")]))
    r.op("check_empty_list", lambda: c1.check([]))

    # ---- add (counters are ASCII decimal)
    r.op("add_new", lambda: c1.add(k("n"), 5))
    r.op("add_negative", lambda: c2.add(k("n"), -7))
    r.op("get_counter_ascii", lambda: c1.get(k("n")))
    r.op("add_zero_creates", lambda: c1.add(k("z"), 0))
    r.op("get_zero_counter", lambda: c1.get(k("z")))
    r.op("add_to_set_decimal", lambda: (c1.set(k("d"), b"41"), c1.add(k("d"), 1))[1])
    r.op("add_to_leading_digits_value", lambda: (c1.set(k("p"), b"12abc"), c1.add(k("p"), 1), c1.get(k("p")))[1:])
    r.op("add_to_padded_value", lambda: (c1.set(k("w"), b" +7"), c1.add(k("w"), 1))[1])
    r.op("add_int64_wraps", lambda: (c1.set(k("o"), str(2**63 - 1)), c1.add(k("o"), 1), c1.get(k("o")))[1:])
    r.op("add_int64_min_delta", lambda: c1.add(k("mn"), -(2**63)))

    # ---- compare_set
    r.op("cas_missing_expected_empty", lambda: c1.compare_set(k("c1"), "", b"d1"))
    r.op("cas_missing_expected_empty_stored", lambda: c2.get(k("c1")))
    r.op("cas_missing_expected_nonempty", lambda: c1.compare_set(k("c2"), b"x", b"d2"))
    r.op("cas_missing_expected_nonempty_not_stored", lambda: c1.check([k("c2")]))
    r.op("cas_present_match", lambda: c1.compare_set(k("c1"), b"d1", b"d3"))
    r.op("cas_present_match_stored", lambda: c2.get(k("c1")))
    r.op("cas_present_mismatch", lambda: c1.compare_set(k("c1"), b"zz", b"d4"))
    r.op("cas_present_expected_empty", lambda: c1.compare_set(k("c1"), "", b"d5"))
    r.op("cas_present_empty_value_expected_empty", lambda: (c1.set(k("c3"), b""), c1.compare_set(k("c3"), "", b"filled"))[1])
    r.op("cas_desired_empty", lambda: c1.compare_set(k("c1"), b"d3", b""))
    r.op("cas_desired_empty_stored", lambda: (c1.get(k("c1")), c1.check([k("c1")])))
    r.op("cas_binary", lambda: c1.compare_set(k("c4"), "", b"\x00\xff"))

    # ---- delete
    r.op("delete_present", lambda: c1.delete_key(k("z")))
    r.op("delete_absent", lambda: c1.delete_key(k("z")))
    r.op("check_after_delete", lambda: c1.check([k("z")]))

    # ---- append
    r.op("append_creates", lambda: (c1.append(k("ap"), b"\x01\x02"), c1.get(k("ap")))[1])
    r.op("append_concatenates", lambda: (c2.append(k("ap"), b"\x03"), c1.append(k("ap"), b""), c1.get(k("ap")))[2])
    r.op("append_digits_then_add", lambda: (c1.add(k("ad"), 5), c1.append(k("ad"), "0"), c1.add(k("ad"), 1))[2])

    # ---- multi_set / multi_get
    r.op("multi_set", lambda: c1.multi_set([k("m1"), k("m2"), k("m3")], [b"v1", b"", b"\x00"]))
    r.op("multi_get", lambda: c2.multi_get([k("m1"), k("m2"), k("m3")]))
    r.op("multi_get_empty_list", lambda: c1.multi_get([]))
    r.op("multi_set_duplicate_key_last_wins", lambda: (c1.multi_set([k("md"), k("md")], ["1", "2"]), c1.get(k("md")))[1])
    r.op("multi_set_length_mismatch", lambda: c1.multi_set([k("mx"), k("my")], ["1"]))
    r.op("multi_get_missing_times_out", lambda: c3.multi_get([k("m1"), k("never")]))

    # ---- blocking reads woken by another client
    w = Waiter(r, lambda: c2.get(k("late")))
    r.result("get_blocks_until_set.parked", w.parked())
    r.op("get_blocks_until_set.set", lambda: c1.set(k("late"), b"arrived"))
    r.result("get_blocks_until_set.result", w.join())

    w = Waiter(r, lambda: c2.wait([k("a"), k("w1"), k("w2")]))
    r.result("wait_counts_missing_keys.parked", w.parked())
    r.do(lambda: c1.set(k("w1"), b"1"))
    r.do(c1.num_keys)  # a round trip on c1: its SET has been applied
    r.result("wait_counts_missing_keys.blocked_after_first", w.still_blocked())
    r.do(lambda: c1.set(k("w2"), b"2"))
    r.result("wait_counts_missing_keys.result", w.join())

    for writer, fn in [("add", lambda: c1.add(k("wa"), 1)),
                       ("append", lambda: c1.append(k("wb"), b"x")),
                       ("multi_set", lambda: c1.multi_set([k("wc")], [b"x"])),
                       ("compare_set", lambda: c1.compare_set(k("wd"), "", b"x"))]:
        key = {"add": "wa", "append": "wb", "multi_set": "wc", "compare_set": "wd"}[writer]
        w = Waiter(r, lambda key=key: c2.get(k(key)))
        w.parked()
        r.do(fn)
        r.result(f"get_woken_by_{writer}", w.join())

    w = Waiter(r, lambda: c2.get(k("del")))
    w.parked()
    r.op("delete_missing_does_not_wake.delete", lambda: c1.delete_key(k("del")))
    r.do(c1.num_keys)
    r.result("delete_missing_does_not_wake.blocked", w.still_blocked())
    r.do(lambda: c1.set(k("del"), b"now"))
    r.result("delete_missing_does_not_wake.result", w.join())

    c4 = r.do(client)
    wa, wb = Waiter(r, lambda: c2.get(k("fan"))), Waiter(r, lambda: c4.get(k("fan")))
    r.result("set_wakes_all_waiters.parked", [wa.parked(), wb.parked()])
    r.do(lambda: c1.set(k("fan"), b"all"))
    r.result("set_wakes_all_waiters.result", [wa.join(), wb.join()])

    # torch's libuv server answers a COMPARE_SET on a missing key with a
    # non-empty expected value without storing anything, but still wakes the
    # key's waiters: a blocked get() then returns b"".
    c5 = r.do(lambda: client(timedelta(seconds=3)))
    w = Waiter(r, lambda: c5.get(k("lie")))
    r.result("cas_missing_wakes_waiters.parked", w.parked())
    r.op("cas_missing_wakes_waiters.cas", lambda: c1.compare_set(k("lie"), b"x", b"y"))
    r.result("cas_missing_wakes_waiters.get_result", w.join())
    r.op("cas_missing_wakes_waiters.key_exists", lambda: c1.check([k("lie")]))

    # ---- contended adds from several clients
    threads, returned, clients = [], [], [r.do(client) for _ in range(4)]
    lock = threading.Lock()

    def adder(c):
        vals = r.do(lambda: [c.add(k("contended"), 1) for _ in range(250)]) or []
        with lock:
            returned.extend(vals)

    for c in clients:
        threads.append(threading.Thread(target=adder, args=(c,)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    r.op("contended_add", lambda: {"final": int(c1.get(k("contended"))),
                                   "returns_are_1_to_n": sorted(returned) == list(range(1, 1001))})

    # ---- queues
    if use_libuv:
        r.op("queue_push", lambda: [c1.queue_push(k("q"), v) for v in (b"a", b"\x00b", b"")])
        # Asked on the pushing connection: a push has no reply, so another
        # connection asking at once races it (torch's one-threaded server
        # happens to read the push first; a replicated store need not).
        r.op("queue_len", lambda: c1.queue_len(k("q")))
        r.op("queue_len_never_used", lambda: c1.queue_len(k("nq")))
        r.op("queue_is_not_a_kv_key", lambda: (c1.check([k("q")]), c1.num_keys() - base_keys))
        r.op("queue_pop_fifo", lambda: [c2.queue_pop(k("q")) for _ in range(3)])
        r.op("queue_pop_empty_nonblocking", lambda: c1.queue_pop(k("q"), False))
        r.op("queue_pop_empty_blocking_times_out", lambda: c3.queue_pop(k("q")))
        r.op("queue_len_after_drain", lambda: c1.queue_len(k("q")))
        r.op("check_sees_drained_queue", lambda: c1.check([k("q")]))
        r.op("kv_set_same_name_as_queue", lambda: (c1.set(k("q"), b"kv"), c1.queue_len(k("q")), c1.get(k("q"))))
        r.op("queue_push_then_check", lambda: (c1.queue_push(k("q2"), b"x"), c1.check([k("q2")]))[1])
        w = Waiter(r, lambda: c2.queue_pop(k("qb")))
        r.result("queue_pop_blocks_until_push.parked", w.parked())
        r.do(lambda: c1.queue_push(k("qb"), b"pushed"))
        r.result("queue_pop_blocks_until_push.result", w.join())
        wa, wb = Waiter(r, lambda: c2.queue_pop(k("q1"))), Waiter(r, lambda: c4.queue_pop(k("q1")))
        r.result("queue_push_wakes_one.parked", [wa.parked(), wb.parked()])
        r.do(lambda: c1.queue_push(k("q1"), b"first"))
        end = time.monotonic() + 10
        while wa.thread.is_alive() and wb.thread.is_alive() and time.monotonic() < end:
            time.sleep(0.001)
        first, other = (wa, wb) if not wa.thread.is_alive() else (wb, wa)
        r.result("queue_push_wakes_one.first", first.join())
        r.result("queue_push_wakes_one.other_still_blocked", other.still_blocked())
        r.do(lambda: c1.queue_push(k("q1"), b"second"))
        r.result("queue_push_wakes_one.other", other.join())
        r.op("queue_len_after_handoff", lambda: c1.queue_len(k("q1")))
    else:
        r.op("queue_push_legacy_client", lambda: c1.queue_push(k("q"), b"a"))

    # ---- barrier (TCPStore.barrier sends the BARRIER op)
    c6, c7 = r.do(client), r.do(client)
    wa, wb = Waiter(r, lambda: c6.barrier(k("b"), 3)), Waiter(r, lambda: c7.barrier(k("b"), 3))
    end = time.monotonic() + 10
    while r.do(lambda: c1.check([k("b")]) and c1.get(k("b"))) != b"2":
        if time.monotonic() > end:
            break
        time.sleep(0.001)
    r.op("barrier_counter_while_parked", lambda: c1.get(k("b")))
    r.result("barrier_parked", [wa.parked(settle=False), wb.parked(settle=False)])
    r.op("barrier_last_arrival", lambda: c1.barrier(k("b"), 3))
    r.result("barrier_released", [wa.join(), wb.join()])
    r.op("barrier_counter_after", lambda: c1.get(k("b")))
    r.op("barrier_reuse_passes_at_once", lambda: (c1.barrier(k("b"), 3), c1.get(k("b")))[1])
    r.op("barrier_world_size_1", lambda: c1.barrier(k("b1"), 1))
    r.op("barrier_timeout", lambda: c1.barrier(k("bt"), 2, timedelta(milliseconds=150)))
    r.op("barrier_timeout_leaves_count", lambda: c1.get(k("bt")))
    r.op("barrier_default_timeout", lambda: c3.barrier(k("bd"), 2))
    r.op("barrier_counter_is_a_counter", lambda: c1.add(k("b"), 0))

    # ---- PrefixStore ("prefix/" + key; barrier is Store's generic one)
    p = dist.PrefixStore(k("pfx"), c1)
    r.op("prefix_set_get", lambda: (p.set("x", b"y"), p.get("x"))[1])
    r.op("prefix_wire_key", lambda: c1.get(k("pfx") + "/x"))
    r.op("prefix_nested_wire_key", lambda: (dist.PrefixStore("outer", dist.PrefixStore(k("inner"), c1)).set("z", b"w"),
                                            c1.get(k("inner") + "/outer/z"))[1])
    r.op("prefix_add", lambda: p.add("n", 2))
    r.op("prefix_compare_set", lambda: p.compare_set("x", b"y", b"y2"))
    r.op("prefix_check", lambda: p.check(["x", "nope"]))
    r.op("prefix_multi_set_get", lambda: (p.multi_set(["m1", "m2"], [b"1", b"2"]), p.multi_get(["m1", "m2"]))[1])
    r.op("prefix_append", lambda: (p.append("ap", b"12"), p.append("ap", b"3"), p.get("ap"))[2])
    r.op("prefix_delete", lambda: p.delete_key("ap"))
    r.op("prefix_list_keys", lambda: sorted(p.list_keys()))
    r.op("prefix_wait_times_out", lambda: p.wait(["nope"], timedelta(milliseconds=100)))
    r.op("prefix_barrier_generic", lambda: (p.barrier("pb", 1), c1.get(k("pfx") + "/pb/num_members"),
                                            c1.get(k("pfx") + "/pb/last_member"))[1:])
    r.op("prefix_barrier_generic_timeout", lambda: p.barrier("pb2", 2, timedelta(milliseconds=100)))
    if use_libuv:
        r.op("prefix_queue", lambda: (p.queue_push("q", b"e"), p.queue_len("q"), p.queue_pop("q", False))[1:])
    r.op("prefix_num_keys_is_global", lambda: p.num_keys() == c1.num_keys())

    # ---- clone: a new connection to the same server
    r.op("clone_set_get", lambda: (lambda c: (c.set(k("cl"), b"c"), c.get(k("cl")))[1])(c1.clone()))

    # ---- list_keys / num_keys (this run's namespace only)
    def listed():
        pre = ns + "/"
        return sorted(x[len(pre):] for x in c1.list_keys() if x.startswith(pre))

    r.op("list_keys", listed)
    r.op("num_keys_delta", num_keys_delta)

    # ---- bad input: the server closes that connection, no one else's
    def broken(name, fn, check_key=None):
        def go():
            c = client()
            out = {}
            try:
                fn(c)
                c.num_keys()  # a request with a reply: the closed connection shows here
                out["raised"] = None
            except Exception as e:  # noqa: BLE001
                out["raised"] = r.exc(e)
            if check_key is not None:
                out["stored"] = c1.check([check_key])
            out["others_unaffected"] = c1.get(k("a"))
            return out
        r.op(name, go)

    too_long = k("L") + "x" * (8192 - len(k("L")))
    # (no check of too_long from c1: a CHECK naming it would close c1 too)
    broken("set_key_wire_8193_bytes_closes", lambda c: c.set(too_long, b"v"))
    broken("get_key_wire_8193_bytes_closes", lambda c: c.get(too_long))
    broken("set_value_8MiB_plus_1_closes", lambda c: c.set(k("toobig"), b"x" * (8 * MIB + 1)), k("toobig"))
    broken("add_to_non_number_closes", lambda c: (c.set(k("nn"), b"abc"), c.add(k("nn"), 1)))
    r.op("add_to_non_number_value_kept", lambda: c1.get(k("nn")))
    broken("add_to_empty_value_closes", lambda c: c.add(k("empty"), 1))
    broken("add_out_of_range_value_closes", lambda c: (c.set(k("huge"), b"99999999999999999999"), c.add(k("huge"), 1)))
    broken("barrier_on_non_number_closes", lambda c: c.barrier(k("nn"), 2))
    r.op("num_keys_delta_final", num_keys_delta)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int)
    ap.add_argument("--prefix", default="torch-store-ops", help="key namespace (default %(default)s)")
    ap.add_argument("--run-id", default=None, help="fixed run id under the prefix (default random)")
    ap.add_argument("--self-host", action="store_true",
                    help="start torch's own server in-process on a free loopback port and use it")
    ap.add_argument("--server-libuv", type=int, default=1, choices=(0, 1),
                    help="with --self-host: 1 = libuv server (default), 0 = legacy server")
    ap.add_argument("--client-libuv", type=int, default=1, choices=(0, 1),
                    help="use_libuv of the clients (0 makes queue ops raise client-side)")
    ap.add_argument("--timeout", type=float, default=30.0, help="store timeout of the clients, s")
    ap.add_argument("--settle-ms", type=float, default=100.0,
                    help="wait after a blocking call is seen sent, before waking it (default %(default)s)")
    ap.add_argument("--deadline", type=float, default=180.0, help="watchdog, s (exit 124)")
    a = ap.parse_args()
    global _settle_s
    _settle_s = a.settle_ms / 1000.0

    start_watchdog(a.deadline)
    server = None
    if a.self_host:
        server = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=bool(a.server_libuv),
                               wait_for_workers=False, timeout=timedelta(seconds=a.timeout))
        host, port = "127.0.0.1", server.port
    else:
        if a.port is None:
            ap.error("--port is required unless --self-host")
        host, port = a.host, a.port
    run_id = a.run_id or "%08x" % random.SystemRandom().getrandbits(32)
    ns = f"{a.prefix}/{run_id}"
    try:
        r = run_script(host, port, ns, a.timeout, bool(a.client_libuv))
    except Exception as e:  # noqa: BLE001 - keep the summary line coming
        r = Runner(ns)
        emit({"op": "script_aborted", "result": r.exc(e)})
    digest = hashlib.sha256("\n".join(_lines).encode()).hexdigest()
    emit({"summary": {"ops": r.count, "sha256_of_op_lines": digest,
                      "torch": torch.__version__.split("+")[0],
                      "parked_by_sleep": _sleep_fallbacks}})
    sys.stdout.flush()
    os._exit(0)  # daemon waiter threads may still hold sockets; do not wait


if __name__ == "__main__":
    sys.exit(main())
