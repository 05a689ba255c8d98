#!/usr/bin/env python3
"""CLI driver around jaxlib's low-level coordination client.

One process = one task.  Rust integration tests start N of these (with the
venv from scripts/setup-jax.sh) against a coordination service and read the
JSON lines they print on stdout:

    {"check": NAME, "ok": BOOL, "detail": ...}

Subcommands:

  ops   exercise every client method (cooperating with the other N-1 tasks);
        one JSON line per check, then a "summary" line; exit 1 if any failed.
  loop  KV set/get + barriers with the peers for --seconds, appending every
        acknowledged write to --acked; verify all acked keys at the end.
  hold  connect, start a blocking call (barrier / get / set), print READY
        while it is in flight, print its result as JSON.
  alive connect, print READY, then for --seconds either idle (heartbeats
        only) or, with --kv, set and read back a key every --pause-ms,
        printing an "alive_round" line per round; exits without shutdown.

The client is `jaxlib._jax.get_distributed_runtime_client`:

    get_distributed_runtime_client(address: str, node_id: int,
        rpc_timeout: int | None = None, init_timeout: int | None = None,
        shutdown_timeout: int | None = None, heartbeat_timeout: int | None = None,
        missed_heartbeat_callback: Callable | None = None,
        shutdown_on_destruction: bool | None = None,
        use_compression: bool | None = None, mtls_cert_file=None,
        mtls_key_file=None, mtls_ca_file=None, mtls_peer_uri_prefix=None,
        verify_secure_credentials=None) -> DistributedRuntimeClient

(timeouts in seconds).  Errors are jax.errors.JaxRuntimeError (a
RuntimeError) whose message starts with "CODE: ".

Every run is bounded by --deadline (a watchdog prints a failing
"watchdog" line and exits 124; a faulthandler backstop exits a few seconds
later even if the interpreter is wedged).

Where `ops` needs a blocking get to be parked before it sets the key (a
wake-up, a cross-task handoff) it reads the parked gets off the coordstore
node's status (`$COORDSTORE_BIN ctl status`; the Rust harness sets
COORDSTORE_BIN).  Against jaxlib's own service (COORDSTORE_BIN unset) or an
address without coordstore's Node API (a relay, a namespace port) there is
nothing to read, and it gives the get a bounded pause instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import faulthandler

# --------------------------------------------------------------------------
# output / watchdog

_out_lock = threading.Lock()


def emit(obj: dict) -> None:
    line = json.dumps(obj, sort_keys=False, default=str)
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def log(msg: str) -> None:
    with _out_lock:
        sys.stderr.write(f"[jax_client pid={os.getpid()}] {msg}\n")
        sys.stderr.flush()


def start_watchdog(seconds: float) -> None:
    """Bound the whole process.  jaxlib releases the GIL in its blocking calls,
    so a Python timer thread can still run; faulthandler is the backstop."""

    def fire() -> None:
        emit({"check": "watchdog", "ok": False,
              "detail": f"process exceeded its deadline of {seconds:.0f} s"})
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(124)

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    faulthandler.dump_traceback_later(seconds + 10, exit=True)


# --------------------------------------------------------------------------
# jaxlib helpers

_CODE_RE = re.compile(r"^\s*([A-Z][A-Z_]+):")


def error_code(exc: BaseException) -> str | None:
    """'DEADLINE_EXCEEDED: ...' -> 'DEADLINE_EXCEEDED' (None if not a status)."""
    m = _CODE_RE.match(str(exc))
    return m.group(1) if m else None


def short(exc: BaseException, limit: int = 300) -> str:
    s = str(exc).replace("\n", " | ")
    return s if len(s) <= limit else s[:limit] + "..."


def make_client(args):
    from jaxlib import _jax  # imported late: keeps --help fast

    kwargs = dict(
        init_timeout=args.init_timeout,
        heartbeat_timeout=args.heartbeat_timeout,
        shutdown_timeout=args.shutdown_timeout,
        use_compression=not args.no_compression,
    )
    if args.rpc_timeout is not None:
        kwargs["rpc_timeout"] = args.rpc_timeout
    if args.mtls_ca:
        kwargs.update(mtls_cert_file=args.mtls_cert, mtls_key_file=args.mtls_key,
                      mtls_ca_file=args.mtls_ca, verify_secure_credentials=True)
    return _jax.get_distributed_runtime_client(args.address, args.node_id, **kwargs)


class CheckFailed(Exception):
    pass


class ExpectedError(Exception):
    pass


def expect_error(code: str, fn, *a, **kw) -> dict:
    """Run fn; it must raise a jaxlib error with status `code`."""
    t0 = time.monotonic()
    try:
        r = fn(*a, **kw)
    except Exception as e:  # noqa: BLE001
        got = error_code(e)
        el = round((time.monotonic() - t0) * 1000, 1)
        if got != code:
            raise CheckFailed(f"expected {code}, got {type(e).__name__}: {short(e)}")
        return {"code": got, "elapsed_ms": el, "message": short(e, 160)}
    raise CheckFailed(f"expected {code}, call succeeded with {r!r:.200}")


def eq(got, want, what: str = "value") -> None:
    if got != want:
        raise CheckFailed(f"{what}: got {got!r:.300}, want {want!r:.300}")


# --------------------------------------------------------------------------
# evidence of parked calls


class NoNodeApi(Exception):
    """There is no coordstore Node API to ask at --address."""


def parked_kv_gets(args) -> int:
    """Blocking gets parked at the coordstore node at --address now: its
    status' parked_by_kind["kv_get"], read with `$COORDSTORE_BIN ctl status`
    (the Rust harness sets COORDSTORE_BIN).  Raises NoNodeApi without
    COORDSTORE_BIN (jaxlib's own service, as selftest_builtin.sh runs it) and
    where the address serves no Node API (UNIMPLEMENTED: a relay, a
    namespace port); RuntimeError when the status read fails otherwise."""
    binary = os.environ.get("COORDSTORE_BIN")
    if not binary:
        raise NoNodeApi("COORDSTORE_BIN is not set")
    cmd = [binary, "ctl", "--endpoint", args.address]
    if args.mtls_ca:
        cmd += ["--tls-ca", args.mtls_ca]
        if args.mtls_cert and args.mtls_key:
            cmd += ["--tls-cert", args.mtls_cert, "--tls-key", args.mtls_key]
    cmd.append("status")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        why = r.stderr.strip()
        if "UNIMPLEMENTED" in why:
            raise NoNodeApi(why)
        raise RuntimeError(why or f"coordstore ctl status exited {r.returncode}")
    return int(json.loads(r.stdout).get("parked_by_kind", {}).get("kv_get", 0))


def parked_gets_now(args) -> int:
    """parked_kv_gets, or 0 where it cannot be read (a wait counting from it
    then falls back or fails, naming why)."""
    try:
        return parked_kv_gets(args)
    except Exception:  # noqa: BLE001
        return 0


def wait_parked_gets(args, before: int, more: int, within_s: float, grace_s: float) -> dict:
    """Waits until `more` blocking gets beyond the `before` counted earlier
    are parked at the coordstore node at --address (parked_kv_gets; a get
    whose caller timed out may stay counted), for up to `within_s`; raises
    CheckFailed naming the last count seen if they never are.  Where there
    is no Node API to ask (see NoNodeApi) it can only give the calls
    `grace_s` to get there, a bounded pause that proves nothing, and says so
    in the detail it returns."""
    if more <= 0:
        return {}
    deadline = time.monotonic() + within_s
    pause, last = 0.01, "nothing"
    while True:
        try:
            parked = parked_kv_gets(args)
            if parked >= before + more:
                return {"parked_gets": parked, "parked_before": before}
            last = f"{parked} parked, {before} before"
        except NoNodeApi as e:
            time.sleep(grace_s)
            return {"parked_gets": "not observable", "why": short(e, 160)}
        except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
            last = short(e, 160)
        if time.monotonic() >= deadline:
            raise CheckFailed(f"{more} more blocking get(s) never parked at {args.address} "
                              f"within {within_s:.0f} s; last seen: {last}")
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


# --------------------------------------------------------------------------
# ops


class Ops:
    def __init__(self, args):
        self.args = args
        self.k = args.node_id
        self.n = args.num_tasks
        self.ns = args.namespace.strip("/")
        self.T = f"{self.ns}/t{self.k}"  # this task's private keys
        self.S = f"{self.ns}/shared"  # keys shared by all tasks
        self.to = args.timeout_ms
        self.client = None
        self.results: list[tuple[str, bool]] = []
        self.incarnations: dict[int, int] | None = None
        # Gets parked at the node as the cooperative KV phase begins.
        self.parked_before_kv = 0

    # -- bookkeeping
    def check(self, name: str, fn, *a) -> bool:
        t0 = time.monotonic()
        try:
            detail = fn(*a)
            ok = True
        except CheckFailed as e:
            ok, detail = False, str(e)
        except Exception as e:  # noqa: BLE001  (unexpected jaxlib error etc.)
            ok, detail = False, f"{type(e).__name__} [{error_code(e)}]: {short(e)}"
        if detail is None:
            detail = {}
        if isinstance(detail, dict):
            detail.setdefault("elapsed_ms", round((time.monotonic() - t0) * 1000, 1))
        emit({"check": name, "ok": ok, "detail": detail})
        self.results.append((name, ok))
        return ok

    def skip(self, name: str, why: str) -> None:
        emit({"check": name, "ok": True, "detail": {"skipped": why}})
        self.results.append((name, True))

    def phase(self, name: str) -> None:
        """All-task barrier separating cooperative phases."""
        self.check(f"phase_{name}", self.client.wait_at_barrier,
                   f"{self.ns}/phase/{name}", self.to)

    # -- the run
    def run(self) -> int:
        c = self.client = make_client(self.args)
        k, n, T, S, to = self.k, self.n, self.T, self.S, self.to

        ok = self.check("connect", c.connect)
        if not ok:
            return self.finish()

        # Clean leftovers of an earlier run that used the same namespace
        # (a fresh namespace makes this a no-op).
        def cleanup():
            c.key_value_delete(T)
            if k == 0:
                c.key_value_delete(S)
        self.check("cleanup_namespace", cleanup)
        self.phase("start")

        # ---------------- single-task KV semantics (private keys)
        self.check("kv_set_try_get", self.kv_set_try_get)
        self.check("kv_blocking_get_present", lambda: eq(c.blocking_key_value_get(f"{T}/a", to), "alpha"))
        self.check("kv_set_already_exists", self.kv_set_already_exists)
        self.check("kv_set_allow_overwrite", self.kv_set_allow_overwrite)
        self.check("kv_set_bytes", self.kv_set_bytes)
        self.check("kv_set_bytes_already_exists", self.kv_set_bytes_already_exists)
        self.check("kv_empty_value", self.kv_empty_value)
        self.check("kv_unicode_value", self.kv_unicode_value)
        if self.args.large_bytes > 0:
            self.check("kv_large_value", self.kv_large_value)
        else:
            self.skip("kv_large_value", "--large-bytes 0")
        self.check("kv_try_get_missing", lambda: expect_error("NOT_FOUND", c.key_value_try_get, f"{T}/missing"))
        self.check("kv_try_get_bytes_missing",
                   lambda: expect_error("NOT_FOUND", c.key_value_try_get_bytes, f"{T}/missing"))
        self.check("kv_blocking_get_timeout", self.kv_blocking_get_timeout)
        # The tasks take this one in turn: its wait for the get to be parked
        # counts the node's parked gets, which must be this task's alone.
        for j in range(n):
            self.phase(f"wakes_{j}")
            if j == k:
                self.check("kv_blocking_get_wakes", self.kv_blocking_get_wakes)
        self.phase("woken")
        self.check("kv_key_normalization", self.kv_key_normalization)
        self.check("kv_dir_get", self.kv_dir_get)
        self.check("kv_dir_get_trailing_slash", self.kv_dir_get_trailing_slash)
        self.check("kv_dir_get_bytes", self.kv_dir_get_bytes)
        self.check("kv_dir_get_empty", lambda: eq(c.key_value_dir_get(f"{T}/nothing"), [], "dir_get"))
        self.check("kv_delete_key", self.kv_delete_key)
        self.check("kv_delete_recursive", self.kv_delete_recursive)
        self.check("kv_delete_missing", lambda: c.key_value_delete(f"{T}/never/existed"))
        self.check("kv_increment", self.kv_increment)
        self.check("kv_increment_not_integer", self.kv_increment_not_integer)

        # ---------------- cooperative KV
        if k == 0:  # (no get is in flight between "woken" and "kv")
            self.parked_before_kv = parked_gets_now(self.args)
        self.phase("kv")
        self.check("kv_cross_task_blocking_get", self.kv_cross_task_blocking_get)
        self.check("kv_exchange_all", self.kv_exchange_all)
        self.check("kv_increment_shared_concurrent", lambda: c.key_value_increment(f"{S}/ctr", 1))
        self.phase("exchanged")
        self.check("kv_dir_get_shared", self.kv_dir_get_shared)
        self.check("kv_increment_shared_total", lambda: eq(c.key_value_try_get(f"{S}/ctr"), str(n), "counter"))
        self.check("kv_already_exists_other_task",
                   lambda: expect_error("ALREADY_EXISTS", c.key_value_set, f"{S}/task/0", "clobber"))
        self.phase("before_shared_delete")
        if k == 0:
            self.check("kv_delete_shared_dir", lambda: c.key_value_delete(f"{S}/task"))
        self.phase("shared_deleted")
        self.check("kv_delete_visible_to_all", lambda: eq(c.key_value_dir_get(f"{S}/task"), [], "dir_get"))

        # ---------------- barriers
        self.check("barrier_all", c.wait_at_barrier, f"{self.ns}/b/all", to)
        self.check("barrier_reuse_same_id", self.barrier_reuse)
        self.check("barrier_explicit_all_ids", c.wait_at_barrier, f"{self.ns}/b/explicit", to, list(range(n)))
        self.barrier_subset()
        self.barrier_timeout()
        self.check("barrier_after_timeout", c.wait_at_barrier, f"{self.ns}/b/after-timeout", to)
        self.check("barrier_unknown_task",
                   lambda: expect_error("INVALID_ARGUMENT", c.wait_at_barrier,
                                        f"{self.ns}/b/unknown/{k}", to, [k, n]))
        if n >= 2:
            other = (k + 1) % n
            self.check("barrier_non_participant",
                       lambda: expect_error("INVALID_ARGUMENT", c.wait_at_barrier,
                                            f"{self.ns}/b/nonpart/{k}", to, [other]))
        else:
            self.skip("barrier_non_participant", "needs N >= 2")
        self.barrier_conflicting()
        self.barrier_different_subset()
        self.phase("barriers_done")

        # ---------------- live nodes
        self.check("get_live_nodes_all", self.live_all)
        self.check("get_live_nodes_self", self.live_self)
        if n >= 2:
            other = (k + 1) % n
            self.check("get_live_nodes_not_member",
                       lambda: expect_error("INVALID_ARGUMENT", c.get_live_nodes, [other]))
        else:
            self.skip("get_live_nodes_not_member", "needs N >= 2")
        self.phase("live_published")
        self.check("get_live_nodes_consistent", self.live_consistent)

        self.phase("end")
        self.check("shutdown", c.shutdown)
        return self.finish()

    def finish(self) -> int:
        failed = [name for name, ok in self.results if not ok]
        emit({"check": "summary", "ok": not failed,
              "detail": {"task": self.k, "num_tasks": self.n,
                         "passed": len(self.results) - len(failed), "failed": failed}})
        return 0 if not failed else 1

    # -- single-task KV
    def kv_set_try_get(self):
        c, T = self.client, self.T
        c.key_value_set(f"{T}/a", "alpha")
        eq(c.key_value_try_get(f"{T}/a"), "alpha")
        eq(c.key_value_try_get_bytes(f"{T}/a"), b"alpha", "try_get_bytes")

    def kv_set_already_exists(self):
        c, T = self.client, self.T
        d = expect_error("ALREADY_EXISTS", c.key_value_set, f"{T}/a", "beta")
        eq(c.key_value_try_get(f"{T}/a"), "alpha", "value after rejected set")
        d2 = expect_error("ALREADY_EXISTS", c.key_value_set, f"{T}/a", "beta", False)
        return {"first": d, "explicit_false": d2}

    def kv_set_allow_overwrite(self):
        c, T = self.client, self.T
        c.key_value_set(f"{T}/a", "beta", allow_overwrite=True)
        eq(c.key_value_try_get(f"{T}/a"), "beta")
        c.key_value_set(f"{T}/a", "alpha", True)
        eq(c.blocking_key_value_get(f"{T}/a", self.to), "alpha")

    BIN = b"\x00\xff\x80binary\x00\x01\xfe"

    def kv_set_bytes(self):
        c, T = self.client, self.T
        c.key_value_set_bytes(f"{T}/bin", self.BIN)
        eq(c.key_value_try_get_bytes(f"{T}/bin"), self.BIN, "try_get_bytes")
        eq(c.blocking_key_value_get_bytes(f"{T}/bin", self.to), self.BIN, "blocking_get_bytes")

    def kv_set_bytes_already_exists(self):
        c, T = self.client, self.T
        d = expect_error("ALREADY_EXISTS", c.key_value_set_bytes, f"{T}/bin", b"other")
        eq(c.key_value_try_get_bytes(f"{T}/bin"), self.BIN, "value after rejected set")
        c.key_value_set_bytes(f"{T}/bin", b"\x01\x02", allow_overwrite=True)
        eq(c.key_value_try_get_bytes(f"{T}/bin"), b"\x01\x02", "value after overwrite")
        return d

    def kv_empty_value(self):
        c, T = self.client, self.T
        c.key_value_set(f"{T}/empty", "")
        eq(c.key_value_try_get(f"{T}/empty"), "", "try_get")
        eq(c.blocking_key_value_get(f"{T}/empty", self.to), "", "blocking_get")
        eq(c.key_value_try_get_bytes(f"{T}/empty"), b"", "try_get_bytes")

    def kv_unicode_value(self):
        c, T = self.client, self.T
        v = "h\u00e9llo \u2713 \U0001f600"
        c.key_value_set(f"{T}/unicode/\u00e9", v)
        eq(c.key_value_try_get(f"{T}/unicode/\u00e9"), v)
        eq(c.key_value_try_get_bytes(f"{T}/unicode/\u00e9"), v.encode(), "bytes")

    def kv_large_value(self):
        c, T = self.client, self.T
        size = self.args.large_bytes
        data = random.Random(1000 + self.k).randbytes(size)  # incompressible
        t0 = time.monotonic()
        c.key_value_set_bytes(f"{T}/large", data)
        t1 = time.monotonic()
        got = c.blocking_key_value_get_bytes(f"{T}/large", self.to)
        t2 = time.monotonic()
        eq(len(got), size, "length")
        eq(hashlib.sha256(got).hexdigest(), hashlib.sha256(data).hexdigest(), "sha256")
        # a large compressible value too (the client gzips requests)
        text = ("coordstore " * (size // 11 + 1))[:size]
        c.key_value_set(f"{T}/large-text", text)
        eq(c.key_value_try_get(f"{T}/large-text") == text, True, "compressible value round trip")
        return {"bytes": size, "set_ms": round((t1 - t0) * 1000, 1), "get_ms": round((t2 - t1) * 1000, 1)}

    def kv_blocking_get_timeout(self):
        c, T = self.client, self.T
        d = expect_error("DEADLINE_EXCEEDED", c.blocking_key_value_get, f"{T}/missing", 1000)
        if not (900 <= d["elapsed_ms"] <= 10000):
            raise CheckFailed(f"1000 ms timeout took {d['elapsed_ms']} ms")
        d2 = expect_error("DEADLINE_EXCEEDED", c.blocking_key_value_get_bytes, f"{T}/missing", 500)
        return {"str": d, "bytes": d2}

    def kv_blocking_get_wakes(self):
        c, T = self.client, self.T
        seen: dict = {}
        before = parked_gets_now(self.args)

        def later():
            # The key is set once the get is parked, so that the set wakes it.
            try:
                seen.update(wait_parked_gets(self.args, before, 1, self.to / 2000, 0.3))
            except CheckFailed as e:
                seen["failed"] = str(e)
            finally:
                seen["set_at"] = time.monotonic()
                c.key_value_set(f"{T}/late", "arrived")

        th = threading.Thread(target=later, daemon=True)
        t0 = time.monotonic()
        th.start()
        v = c.blocking_key_value_get(f"{T}/late", self.to)
        returned_at = time.monotonic()
        el = (returned_at - t0) * 1000
        th.join(5)
        if "failed" in seen:
            raise CheckFailed(seen["failed"])
        eq(v, "arrived")
        set_at = seen.pop("set_at", returned_at)
        if returned_at < set_at:
            raise CheckFailed(f"returned after {el:.0f} ms, before the key was set")
        return {"waited_ms": round(el, 1), **seen}

    def kv_key_normalization(self):
        c, T = self.client, self.T
        c.key_value_set(f"/{T}//norm///x/", "n")
        eq(c.key_value_try_get(f"{T}/norm/x"), "n", "try_get of normalised key")
        eq(c.key_value_try_get(f"{T}/norm//x//"), "n", "try_get of denormalised key")
        eq(c.key_value_dir_get(f"{T}/norm"), [(f"{T}/norm/x", "n")], "dir_get")
        expect_error("ALREADY_EXISTS", c.key_value_set, f"{T}/norm/x", "other")

    def _fill_dir(self):
        c, T = self.client, self.T
        # inserted out of order; the listing must come back sorted
        for key, val in [("dir/b", "B"), ("dir/sub/c", "C"), ("dirx/z", "Z"), ("dir", "self"), ("dir/a", "A")]:
            c.key_value_set(f"{T}/{key}", val, allow_overwrite=True)
        return [(f"{T}/dir/a", "A"), (f"{T}/dir/b", "B"), (f"{T}/dir/sub/c", "C")]

    def kv_dir_get(self):
        want = self._fill_dir()
        eq(self.client.key_value_dir_get(f"{self.T}/dir"), want, "dir_get")

    def kv_dir_get_trailing_slash(self):
        want = self._fill_dir()
        eq(self.client.key_value_dir_get(f"{self.T}/dir/"), want, "dir_get")

    def kv_dir_get_bytes(self):
        want = [(k, v.encode()) for k, v in self._fill_dir()]
        eq(self.client.key_value_dir_get_bytes(f"{self.T}/dir"), want, "dir_get_bytes")

    def kv_delete_key(self):
        c, T = self.client, self.T
        c.key_value_set(f"{T}/del1", "x")
        c.key_value_delete(f"{T}/del1")
        expect_error("NOT_FOUND", c.key_value_try_get, f"{T}/del1")
        c.key_value_set(f"{T}/del1", "y")  # can be created again
        eq(c.key_value_try_get(f"{T}/del1"), "y")

    def kv_delete_recursive(self):
        c, T = self.client, self.T
        self._fill_dir()
        c.key_value_delete(f"{T}/dir")
        eq(c.key_value_dir_get(f"{T}/dir"), [], "dir_get after delete")
        expect_error("NOT_FOUND", c.key_value_try_get, f"{T}/dir")
        expect_error("NOT_FOUND", c.key_value_try_get, f"{T}/dir/sub/c")
        eq(c.key_value_try_get(f"{T}/dirx/z"), "Z", "sibling dirx/z survives")

    def kv_increment(self):
        c, T = self.client, self.T
        eq(c.key_value_increment(f"{T}/ctr", 5), 5, "first increment")
        eq(c.key_value_increment(f"{T}/ctr", -2), 3, "negative increment")
        eq(c.key_value_increment(f"{T}/ctr", 0), 3, "zero increment")
        eq(c.key_value_try_get(f"{T}/ctr"), "3", "stored decimal string")
        c.key_value_set(f"{T}/ctr2", "40")
        eq(c.key_value_increment(f"{T}/ctr2", 2), 42, "increment of a set value")

    def kv_increment_not_integer(self):
        c, T = self.client, self.T
        c.key_value_set(f"{T}/notint", "abc")
        return expect_error("FAILED_PRECONDITION", c.key_value_increment, f"{T}/notint", 1)

    # -- cooperative KV
    def kv_cross_task_blocking_get(self):
        c, S = self.client, self.S
        seen: dict = {}
        if self.k == 0:
            # The key is set once every peer is parked in GetKeyValue on it:
            # past the "kv" phase no other get is asked for, and those parked
            # before it are counted in parked_before_kv (the tasks share
            # --address).
            try:
                seen = wait_parked_gets(self.args, self.parked_before_kv, self.n - 1,
                                        self.to / 2000, 0.5)
            finally:
                c.key_value_set(f"{S}/from0", "hello-from-0")
        t0 = time.monotonic()
        v = c.blocking_key_value_get(f"{S}/from0", self.to)
        eq(v, "hello-from-0")
        return {"waited_ms": round((time.monotonic() - t0) * 1000, 1), **seen}

    def kv_exchange_all(self):
        c, S = self.client, self.S
        c.key_value_set(f"{S}/task/{self.k}", f"task-{self.k}")
        for j in range(self.n):
            eq(c.blocking_key_value_get(f"{S}/task/{j}", self.to), f"task-{j}", f"value of task {j}")

    def kv_dir_get_shared(self):
        want = sorted((f"{self.S}/task/{j}", f"task-{j}") for j in range(self.n))
        eq(self.client.key_value_dir_get(f"{self.S}/task"), want, "dir_get")

    # -- barriers
    def barrier_reuse(self):
        for i in range(3):
            self.client.wait_at_barrier(f"{self.ns}/b/all", self.to)
        return {"reused": 3}

    def barrier_subset(self):
        c, k, n = self.client, self.k, self.n
        part = [0, n - 1] if n >= 2 else [0]
        rest = [j for j in range(n) if j not in part]
        if k in part:
            def both():
                c.wait_at_barrier(f"{self.ns}/b/subset", self.to, part)
                c.wait_at_barrier(f"{self.ns}/b/subset", self.to, part)  # reuse
                return {"process_ids": part}
            self.check("barrier_subset", both)
        else:
            self.check("barrier_subset_complement", c.wait_at_barrier,
                       f"{self.ns}/b/subset-complement", self.to, rest)

    def barrier_timeout(self):
        c, k, n = self.client, self.k, self.n
        if n < 2:
            self.skip("barrier_timeout", "needs N >= 2")
            return
        if k == n - 1:
            # the straggler: never arrives at b/timeout; the next all-task
            # barrier holds it until the others have timed out.
            self.skip("barrier_timeout", "this task is the absent participant")
            return

        def timed():
            d = expect_error("DEADLINE_EXCEEDED", c.wait_at_barrier, f"{self.ns}/b/timeout", 1000)
            if not (900 <= d["elapsed_ms"] <= 10000):
                raise CheckFailed(f"1000 ms barrier timeout took {d['elapsed_ms']} ms")
            return d
        self.check("barrier_timeout", timed)

    def barrier_conflicting(self):
        c, k, n = self.client, self.k, self.n
        if n < 3:
            self.skip("barrier_conflicting_tasks", "needs N >= 3")
            return
        if k == 0:
            self.check("barrier_conflicting_tasks",
                       lambda: expect_error("INVALID_ARGUMENT", c.wait_at_barrier,
                                            f"{self.ns}/b/conflict", self.to, [0, 1]))
        elif k == 1:
            self.check("barrier_conflicting_tasks",
                       lambda: expect_error("INVALID_ARGUMENT", c.wait_at_barrier,
                                            f"{self.ns}/b/conflict", self.to, list(range(n))))
        else:
            self.skip("barrier_conflicting_tasks", "only tasks 0 and 1 take part")

    def barrier_different_subset(self):
        """Task 0 passes an id alone; task 1 then calls it with [1] (XLA's
        WaitAtBarrier_DifferentSubset_Fails): the finished instance checks
        the late caller's arguments first."""
        c, k, n = self.client, self.k, self.n
        if n < 2:
            self.skip("barrier_different_subset", "needs N >= 2")
            return
        bid, passed = f"{self.ns}/b/diffsub", f"{self.ns}/diffsub/passed"
        if k == 0:
            def alone():
                c.wait_at_barrier(bid, self.to, [0])
                c.key_value_set(passed, "yes")
                return {"passed_alone": [0]}
            self.check("barrier_different_subset", alone)
        elif k == 1:
            def late():
                c.blocking_key_value_get(passed, self.to)
                d = expect_error("INVALID_ARGUMENT", c.wait_at_barrier, bid, self.to, [1])
                if "Conflicting tasks" not in d["message"]:
                    raise CheckFailed(f"unexpected message: {d['message']}")
                return d
            self.check("barrier_different_subset", late)
        else:
            self.skip("barrier_different_subset", "only tasks 0 and 1 take part")

    # -- live nodes
    def live_all(self):
        live = self.client.get_live_nodes(list(range(self.n)))
        eq(sorted(live), list(range(self.n)), "live task ids")
        for j, inc in live.items():
            if not isinstance(inc, int) or inc == 0:
                raise CheckFailed(f"bad incarnation for task {j}: {inc!r}")
        self.incarnations = {int(j): int(v) for j, v in live.items()}
        self.client.key_value_set(f"{self.S}/live/{self.k}", json.dumps(sorted(self.incarnations.items())))
        return {"live": sorted(live)}

    def live_self(self):
        live = self.client.get_live_nodes([self.k])
        eq(sorted(live), [self.k], "live task ids")
        if self.incarnations is not None:
            eq(live[self.k], self.incarnations[self.k], "own incarnation")

    def live_consistent(self):
        seen = {}
        for j in range(self.n):
            seen[j] = self.client.blocking_key_value_get(f"{self.S}/live/{j}", self.to)
        if len(set(seen.values())) != 1:
            raise CheckFailed(f"tasks saw different live sets: {seen}")


# --------------------------------------------------------------------------
# loop


def run_loop(args) -> int:
    k, n = args.node_id, args.num_tasks
    ns = args.namespace.strip("/")
    to = args.timeout_ms
    acked_f = open(args.acked, "w", buffering=1) if args.acked else None
    acked: list[tuple[str, str]] = []
    errors: list[dict] = []
    retried = 0
    max_lat = {"set": 0.0, "get": 0.0, "barrier": 0.0}
    c = make_client(args)

    def value_of(key_round: int) -> str:
        return f"v{k}-{key_round}"

    def timed(op, fn, *a):
        t0 = time.monotonic()
        r = fn(*a)
        dt = (time.monotonic() - t0) * 1000
        if dt > max_lat[op]:
            max_lat[op] = dt
        return r

    def kv_with_retry(op, fn, retry_fn, *a):
        """Retry transient KV failures if --max-retries allows it."""
        nonlocal retried
        attempt = 0
        f = fn
        while True:
            try:
                return timed(op, f, *a)
            except Exception as e:  # noqa: BLE001
                code = error_code(e)
                if attempt >= args.max_retries or code not in ("UNAVAILABLE", "ABORTED", "INTERNAL", "CANCELLED"):
                    raise
                attempt += 1
                retried += 1
                log(f"retrying {op} after {code}: {short(e, 120)}")
                time.sleep(min(0.05 * 2 ** attempt, 1.0))
                f = retry_fn

    t_start = time.monotonic()
    try:
        c.connect()
    except Exception as e:  # noqa: BLE001
        emit({"check": "loop", "ok": False, "detail": {"task": k, "error": f"connect: {short(e)}"}})
        return 1
    t_conn = time.monotonic()
    log(f"task {k}/{n} connected in {(t_conn - t_start) * 1000:.0f} ms; looping {args.seconds} s")

    r = 0
    last_progress = t_conn
    stop = False
    while not stop:
        op = "?"
        try:
            key = f"{ns}/t{k}/{r}"
            val = value_of(r)
            op = "set"
            kv_with_retry("set", c.key_value_set, lambda kk, vv: c.key_value_set(kk, vv, True), key, val)
            acked.append((key, val))
            if acked_f:
                acked_f.write(key + "\n")
                acked_f.flush()
            op = "get_own"
            eq(kv_with_retry("get", c.blocking_key_value_get, c.blocking_key_value_get, key, to), val,
               f"read-your-write of {key}")
            if r > 0 and n > 1:
                peer = (k + 1) % n
                op = "get_peer"
                # the peer wrote its round r-1 key before barrier r-1
                eq(kv_with_retry("get", c.blocking_key_value_get, c.blocking_key_value_get,
                                 f"{ns}/t{peer}/{r - 1}", to),
                   f"v{peer}-{r - 1}", f"peer {peer} key of round {r - 1}")
            if k == 0:
                op = "set_ctl"
                decision = "stop" if time.monotonic() - t_conn >= args.seconds else "go"
                kv_with_retry("set", c.key_value_set, lambda kk, vv: c.key_value_set(kk, vv, True),
                              f"{ns}/ctl/{r}", decision)
            op = "barrier"
            # one id reused every round (exercises the per-id counter) ...
            timed("barrier", c.wait_at_barrier, f"{ns}/b/loop", to)
            # ... and a fresh, counter-named id every 10th round
            if r % 10 == 0:
                timed("barrier", c.wait_at_barrier, f"{ns}/b/round/{r}", to)
            op = "get_ctl"
            decision = kv_with_retry("get", c.blocking_key_value_get, c.blocking_key_value_get,
                                     f"{ns}/ctl/{r}", to)
            stop = decision == "stop"
            r += 1
            if args.pause_ms > 0 and not stop:
                time.sleep(args.pause_ms / 1000)
        except Exception as e:  # noqa: BLE001
            errors.append({"round": r, "op": op, "code": error_code(e), "error": short(e)})
            log(f"round {r} {op} failed: {short(e)}")
            break
        now = time.monotonic()
        if now - last_progress >= 5:
            log(f"task {k}: round {r}, {len(acked)} acked, {now - t_conn:.1f} s")
            last_progress = now
    t_loop = time.monotonic()

    # verify every acknowledged write is readable with its value
    missing = []
    for key, val in acked:
        try:
            got = c.blocking_key_value_get(key, to)
            if got != val:
                missing.append({"key": key, "got": got, "want": val})
        except Exception as e:  # noqa: BLE001
            missing.append({"key": key, "error": short(e, 160)})
        if len(missing) >= 20:
            break
    if acked_f:
        acked_f.close()

    shutdown_err = None
    if not args.no_shutdown:
        try:
            c.shutdown()
        except Exception as e:  # noqa: BLE001
            shutdown_err = short(e)
    ok = not errors and not missing and shutdown_err is None
    emit({"check": "loop", "ok": ok, "detail": {
        "task": k, "num_tasks": n, "rounds": r, "acked": len(acked),
        "seconds": round(t_loop - t_conn, 2), "errors": errors, "retried": retried,
        "missing": missing, "shutdown_error": shutdown_err,
        "max_latency_ms": {op: round(v, 1) for op, v in max_lat.items()},
    }})
    return 0 if ok else 1


# --------------------------------------------------------------------------
# hold


def run_hold(args) -> int:
    c = make_client(args)
    pids = [int(x) for x in args.process_ids.split(",")] if args.process_ids else None
    for a in args.action:
        if a in ("get", "set") and args.key is None:
            sys.exit(f"--action {a} needs --key")
        if a == "barrier" and args.barrier_id is None:
            sys.exit("--action barrier needs --barrier-id")
    c.connect()

    results: list[bool] = []
    done = threading.Event()
    ready_printed = threading.Event()

    def ready():
        if not ready_printed.is_set():
            ready_printed.set()
            with _out_lock:
                sys.stdout.write("READY\n")
                sys.stdout.flush()

    def one(action: str) -> None:
        t0 = time.monotonic()
        detail: dict = {"action": action}
        try:
            if action == "barrier":
                detail["barrier_id"] = args.barrier_id
                c.wait_at_barrier(args.barrier_id, args.timeout_ms, pids)
            elif action == "get":
                detail["key"] = args.key
                detail["value"] = c.blocking_key_value_get(args.key, args.timeout_ms)
            elif action == "set":
                detail["key"] = args.key
                c.key_value_set(args.key, args.value, True)
            else:
                raise ValueError(action)
            ok = args.expect_code is None
            if not ok:
                detail["error"] = f"expected {args.expect_code}, call succeeded"
        except Exception as e:  # noqa: BLE001
            code = error_code(e)
            detail["code"] = code
            detail["error"] = short(e)
            ok = args.expect_code is not None and code == args.expect_code
        detail["elapsed_ms"] = round((time.monotonic() - t0) * 1000, 1)
        ready()  # never leave the orchestrator waiting for READY
        emit({"check": f"hold_{action}", "ok": ok, "detail": detail})
        results.append(ok)

    def worker():
        try:
            for a in args.action:
                one(a)
        finally:
            done.set()

    if args.wait_stdin:
        ready()
        line = sys.stdin.readline()
        log(f"stdin said {line.strip()!r}; running {args.action}")
        worker()
    else:
        th = threading.Thread(target=worker, daemon=True)
        th.start()
        # READY = connected and the first call has been in flight for
        # --ready-delay-ms (or already finished).
        done.wait(args.ready_delay_ms / 1000)
        ready()
        done.wait()

    if not args.no_shutdown:
        try:
            c.shutdown()
        except Exception as e:  # noqa: BLE001
            emit({"check": "hold_shutdown", "ok": False, "detail": short(e)})
            results.append(False)
    return 0 if results and all(results) else 1


# --------------------------------------------------------------------------
# alive


def run_alive(args) -> int:
    c = make_client(args)
    k, ns = args.node_id, args.namespace
    c.connect()
    with _out_lock:
        sys.stdout.write("READY\n")
        sys.stdout.flush()
    t0 = time.monotonic()
    r = 0
    while time.monotonic() - t0 < args.seconds:
        if args.kv:
            key, val = f"{ns}/alive/t{k}/{r}", f"r{r}"
            try:
                c.key_value_set(key, val, True)
                got = c.blocking_key_value_get(key, args.timeout_ms)
            except Exception as e:  # noqa: BLE001
                emit({"check": "alive", "ok": False,
                      "detail": {"task": k, "round": r, "code": error_code(e), "error": short(e)}})
                return 1
            if got != val:
                emit({"check": "alive", "ok": False,
                      "detail": {"task": k, "round": r, "got": got, "want": val}})
                return 1
            emit({"check": "alive_round", "ok": True, "round": r,
                  "t": round(time.monotonic() - t0, 2)})
            r += 1
        time.sleep(args.pause_ms / 1000)
    emit({"check": "alive", "ok": True, "detail": {"task": k, "rounds": r}})
    return 0


def run_rejoin(args) -> int:
    """A recoverable task restarts and rejoins a reused barrier id (XLA's
    RecoverableClient_RestartsAndStartsBarrier). Roles:
    first  -- pass the id --rounds times, then exit without shutdown (the
              "crash"); its agent's counters die with it;
    peer   -- pass the id --rounds times, print PASSED, wait for a line on
              stdin, then wait at the id once more (counter = rounds);
    again  -- the restarted task: connect, wait at the id (counter 0).
    peer and again then pass an all-task barrier and shut down."""
    c = make_client(args)
    bid = f"{args.namespace}/b/rejoin"

    def step(name, fn, *a):
        try:
            r = fn(*a)
        except Exception as e:  # noqa: BLE001
            emit({"check": name, "ok": False,
                  "detail": {"code": error_code(e), "error": short(e)}})
            sys.stdout.flush()
            os._exit(1)
        emit({"check": name, "ok": True, "detail": {}})
        return r

    step("connect", c.connect)
    if args.role in ("first", "peer"):
        for i in range(args.rounds):
            step(f"round_{i}", c.wait_at_barrier, bid, args.timeout_ms)
    if args.role == "first":
        sys.stdout.flush()
        os._exit(0)
    if args.role == "peer":
        with _out_lock:
            sys.stdout.write("PASSED\n")
            sys.stdout.flush()
        sys.stdin.readline()
    step("rejoined", c.wait_at_barrier, bid, args.timeout_ms)
    step("before_shutdown", c.wait_at_barrier, f"{args.namespace}/b/before_shutdown",
         args.timeout_ms)
    step("shutdown", c.shutdown)
    emit({"check": "rejoin", "ok": True, "detail": {"role": args.role}})
    return 0


# --------------------------------------------------------------------------
# CLI


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp, deadline):
        sp.add_argument("--address", required=True, help="host:port of the coordination service")
        sp.add_argument("--node-id", type=int, required=True, help="task id, 0..N-1")
        sp.add_argument("--num-tasks", type=int, required=True, help="N")
        sp.add_argument("--namespace", default=f"coordstore-{sp.prog.split()[-1]}",
                        help="prefix of every key and barrier id (default coordstore-<subcommand>; "
                             "use a fresh one per run against a long-lived service)")
        sp.add_argument("--timeout-ms", type=int, default=30000,
                        help="timeout of barriers / blocking gets that should succeed")
        sp.add_argument("--init-timeout", type=int, default=60, help="connect timeout, s")
        sp.add_argument("--heartbeat-timeout", type=int, default=100,
                        help="client heartbeat timeout, s (heartbeat every half of it; jax's default)")
        sp.add_argument("--shutdown-timeout", type=int, default=30, help="client shutdown timeout, s")
        sp.add_argument("--rpc-timeout", type=int, default=None, help="client rpc_timeout, s (unset)")
        sp.add_argument("--no-compression", action="store_true", help="use_compression=False")
        sp.add_argument("--mtls-cert", help="PEM certificate (jaxlib's mtls_cert_file)")
        sp.add_argument("--mtls-key", help="PEM key (mtls_key_file)")
        sp.add_argument("--mtls-ca", help="PEM CA of the service (mtls_ca_file); turns mutual TLS on")
        sp.add_argument("--deadline", type=float, default=deadline,
                        help="hard bound on the whole process, s")

    sp = sub.add_parser("ops", help="exercise every client method")
    common(sp, 120)
    sp.add_argument("--large-bytes", type=int, default=6 << 20,
                    help="size of the large-value check (> tonic's 4 MiB default); 0 skips it")

    sp = sub.add_parser("loop", help="KV + barrier loop for failover tests")
    common(sp, None)
    sp.add_argument("--seconds", type=float, required=True)
    sp.add_argument("--acked", help="file receiving every acknowledged key, one per line")
    sp.add_argument("--pause-ms", type=float, default=0, help="sleep between rounds (default: none)")
    sp.add_argument("--max-retries", type=int, default=0,
                    help="retries of a KV op failing with UNAVAILABLE/ABORTED/INTERNAL/CANCELLED "
                         "(default 0: any error fails the run)")
    sp.add_argument("--no-shutdown", action="store_true", help="exit without client.shutdown()")

    sp = sub.add_parser("hold", help="park in a barrier or blocking get, print READY")
    common(sp, 300)
    sp.add_argument("--action", action="append", choices=["barrier", "get", "set"], required=True,
                    help="repeatable; run in order")
    sp.add_argument("--barrier-id")
    sp.add_argument("--process-ids", help="comma-separated barrier participants (default: all)")
    sp.add_argument("--key")
    sp.add_argument("--value", default="held-value")
    sp.add_argument("--expect-code", help="the action(s) must fail with this status code")
    sp.add_argument("--ready-delay-ms", type=int, default=300,
                    help="print READY once the first call has been pending this long")
    sp.add_argument("--wait-stdin", action="store_true",
                    help="print READY after connect, run the actions after a line on stdin")
    sp.add_argument("--no-shutdown", action="store_true", help="exit without client.shutdown()")

    sp = sub.add_parser("alive", help="stay connected (optionally looping KV) for --seconds")
    common(sp, None)
    sp.add_argument("--seconds", type=float, required=True)
    sp.add_argument("--kv", action="store_true", help="set and read back a key every round")
    sp.add_argument("--pause-ms", type=float, default=200, help="pause between rounds")

    sp = sub.add_parser("rejoin", help="a recoverable task restarts and rejoins a barrier")
    common(sp, 120)
    sp.add_argument("--role", choices=["first", "peer", "again"], required=True)
    sp.add_argument("--rounds", type=int, default=3)

    args = p.parse_args(argv)
    if args.deadline is None:  # loop, alive
        args.deadline = args.seconds + 120
    if not (0 <= args.node_id < args.num_tasks):
        p.error("--node-id must be in 0..num-tasks-1")
    start_watchdog(args.deadline)

    if args.cmd == "ops":
        rc = Ops(args).run()
    elif args.cmd == "loop":
        rc = run_loop(args)
    elif args.cmd == "alive":
        rc = run_alive(args)
    elif args.cmd == "rejoin":
        rc = run_rejoin(args)
    else:
        rc = run_hold(args)
    sys.stdout.flush()
    sys.stderr.flush()
    # The client object's destructor would otherwise run during interpreter
    # teardown; exit directly once everything is reported.
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
