"""A real coordstore cluster for the tests: `coordstore serve` processes on
127.0.0.1 ports picked free, SIGKILLed when the test ends (also when it
fails). The binary is $COORDSTORE_BIN or target/debug/coordstore."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def coordstore_bin() -> str:
    b = os.environ.get("COORDSTORE_BIN") or str(ROOT / "target" / "debug" / "coordstore")
    assert Path(b).exists(), f"{b} is missing: cargo build -p coordstore-service --bin coordstore"
    return b


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, cond, timeout: float = 60.0, every: float = 0.05):
    """Polls ``cond`` until it returns something truthy (returned), or fails
    the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(every)


class Cluster:
    def __init__(self, n: int, tmp: Path, extra: list[str]) -> None:
        self.addrs = [f"127.0.0.1:{free_port()}" for _ in range(n)]
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp
        self.extra = extra
        self.procs: list[subprocess.Popen | None] = [None] * n
        for i in range(n):
            self.start(i)

    def start(self, i: int) -> None:
        cluster = ",".join(f"{j + 1}={a}" for j, a in enumerate(self.addrs))
        log = open(self.tmp / f"node{i + 1}.log", "ab")
        self.procs[i] = subprocess.Popen(
            [
                coordstore_bin(),
                "serve",
                "--node-id", str(i + 1),
                "--listen", self.addrs[i],
                "--data-dir", str(self.tmp / f"node{i + 1}"),
                "--cluster", cluster,
                "--raft-heartbeat-ms", "100",
                "--election-timeout-ms", "800",
                *self.extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def kill(self, i: int) -> None:
        p = self.procs[i]
        if p is not None:
            p.send_signal(signal.SIGKILL)
            p.wait()
            self.procs[i] = None

    def status(self, i: int) -> dict | None:
        if self.procs[i] is None:
            return None
        r = subprocess.run(
            [coordstore_bin(), "ctl", "--endpoint", self.addrs[i], "status"],
            capture_output=True,
            timeout=30,
        )
        return json.loads(r.stdout) if r.returncode == 0 else None

    def leader(self, among: list[int] | None = None, timeout: float = 60.0) -> int:
        """Index of the leader every node of ``among`` agrees on."""
        among = list(range(len(self.addrs))) if among is None else among

        def agreed():
            ids = set()
            for i in among:
                s = self.status(i)
                if not s or not s.get("leader_id"):
                    return None
                ids.add(s["leader_id"])
            return ids.pop() if len(ids) == 1 else None

        return wait_for("an agreed leader", agreed, timeout) - 1

    def parked(self) -> int:
        """Calls parked on the nodes that are up."""
        return sum((self.status(i) or {}).get("parked_calls", 0) for i in range(len(self.addrs)))

    def close(self) -> None:
        for i in range(len(self.procs)):
            self.kill(i)


@pytest.fixture
def cluster_factory(tmp_path):
    made: list[Cluster] = []

    def make(n: int = 3, extra: list[str] | None = None) -> Cluster:
        c = Cluster(n, tmp_path / f"cluster{len(made)}", extra or [])
        made.append(c)
        c.leader()
        return c

    yield make
    for c in made:
        c.close()


class Procs:
    """Python helper processes, SIGKILLed when the test ends."""

    python = sys.executable

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def spawn(self, *args: str, **kw) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, *args], **kw)
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.close()
