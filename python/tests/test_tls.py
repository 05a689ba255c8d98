"""The package over TLS: coordstore.Agent, PreemptionSyncManager, the
in-process Relay and namespace creation against one node with mutual TLS
(``--tls-client-ca``, an admin named by ``--admin-client-name``), with
certificates made by the ``openssl`` CLI. A client without the right
certificate gets nothing; a plaintext TCPStore is refused on the TLS port
and goes through the relay."""

from __future__ import annotations

import json
import shutil
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

import coordstore
from coordstore import errors
from conftest import coordstore_bin, free_port, wait_for

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


class Pki:
    """Two CAs (the servers', the clients') and leaf certificates, as PEM
    files in ``dir``: ``leaf(name)`` is (certificate, key)."""

    def __init__(self, dir: Path) -> None:
        self.dir = dir
        self.servers = self._ca("servers")
        self.clients = self._ca("clients")
        self.rogue = self._ca("rogue")

    def _ca(self, name: str) -> Path:
        openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{name}-ca.key", "-out", f"{name}-ca.pem", "-days", "2",
            "-subj", f"/CN={name} CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=self.dir,
        )
        return self.dir / f"{name}-ca.pem"

    def leaf(self, ca: str, cn: str, sans: str = "") -> tuple[Path, Path]:
        ext = self.dir / f"{cn}.ext"
        lines = [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature",
            "extendedKeyUsage=serverAuth,clientAuth",
        ]
        if sans:
            lines.append(f"subjectAltName={sans}")
        ext.write_text("\n".join(lines) + "\n")
        openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{cn}.key", "-out", f"{cn}.csr", "-subj", f"/CN={cn}",
            cwd=self.dir,
        )
        openssl(
            "x509", "-req", "-in", f"{cn}.csr", "-CA", f"{ca}-ca.pem", "-CAkey", f"{ca}-ca.key",
            "-CAcreateserial", "-out", f"{cn}.pem", "-days", "2", "-extfile", ext.name,
            cwd=self.dir,
        )
        return self.dir / f"{cn}.pem", self.dir / f"{cn}.key"


class TlsNode:
    """One node with mutual TLS on 127.0.0.1 (its peer port plaintext on
    loopback): jobs of 2 tasks, ``ops`` the admin. SIGKILLed by close()."""

    def __init__(self, tmp: Path, pki: Pki) -> None:
        self.pki = pki
        self.node = pki.leaf("servers", "node", "IP:127.0.0.1,DNS:localhost")
        self.ops = pki.leaf("clients", "ops")
        self.job = pki.leaf("clients", "job")
        self.stranger = pki.leaf("rogue", "stranger")
        self.addr = f"127.0.0.1:{free_port()}"
        peer = f"127.0.0.1:{free_port()}"
        self.log = open(tmp / "node.log", "ab")
        self.proc = subprocess.Popen(
            [
                coordstore_bin(), "serve",
                "--node-id", "1",
                "--listen", self.addr,
                "--peer-listen", peer,
                "--cluster", f"1={peer}",
                "--data-dir", str(tmp / "node1"),
                "--tasks", "2",
                "--tls-cert", str(self.node[0]),
                "--tls-key", str(self.node[1]),
                "--tls-client-ca", str(pki.clients),
                "--admin-client-name", "ops",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_for("the node to lead", lambda: (self.status() or {}).get("leader_id") == 1)

    def tls(self, who: tuple[Path, Path]) -> dict[str, Path]:
        return {"tls_ca": self.pki.servers, "tls_cert": who[0], "tls_key": who[1]}

    def ctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                coordstore_bin(), "ctl", "--endpoint", self.addr,
                "--tls-ca", str(self.pki.servers),
                "--tls-cert", str(self.ops[0]),
                "--tls-key", str(self.ops[1]),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )

    def status(self) -> dict | None:
        r = self.ctl("status")
        return json.loads(r.stdout) if r.returncode == 0 else None

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()


@pytest.fixture
def node(tmp_path):
    n = TlsNode(tmp_path, Pki(tmp_path))
    yield n
    n.close()


def connect_all(agents: list[coordstore.Agent]) -> None:
    threads = [threading.Thread(target=a.connect) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(a.state == "CONNECTED" for a in agents), [a.state for a in agents]


def test_agents_and_preemption_sync_over_mutual_tls(node):
    agents = [
        coordstore.Agent([node.addr], "jax_worker", i, heartbeat_interval=1.0, **node.tls(node.job))
        for i in range(2)
    ]
    connect_all(agents)
    agents[0].insert("cfg/lr", "0.1")
    assert agents[1].get("cfg/lr", timeout=30) == b"0.1"
    done = threading.Thread(target=agents[0].barrier, args=("ready", 60))
    done.start()
    agents[1].barrier("ready", 60)
    done.join(60)

    # Preemption sync over the same TLS agents: task 1 is told it will be
    # preempted; both stop at the same step.
    managers = [coordstore.PreemptionSyncManager(a, "manual") for a in agents]
    stops: dict[int, int] = {}

    def count(i: int) -> None:
        for step in range(100_000):
            if managers[i].reached_sync_point(step):
                stops[i] = step
                return
            time.sleep(0.01)

    counters = [threading.Thread(target=count, args=(i,)) for i in range(2)]
    for t in counters:
        t.start()
    managers[1].notify(time.time() + 60)
    for t in counters:
        t.join(60)
    assert len(stops) == 2 and stops[0] == stops[1], stops
    for m in managers:
        m.shutdown()


def _square(x: int) -> int:
    return x * x


def test_the_cluster_coordinator_and_its_workers_over_mutual_tls(node):
    from coordstore import worker

    tls = {k: str(v) for k, v in node.tls(node.job).items()}
    coord = coordstore.ClusterCoordinator([node.addr], "tls-queue", lease=5.0, **tls)
    stop = threading.Event()
    w = threading.Thread(
        target=worker.run,
        args=([node.addr], "tls-queue", "tls-worker", 1, stop),
        kwargs=tls,
        daemon=True,
    )
    w.start()
    try:
        values = [coord.schedule(_square, (i,)) for i in range(5)]
        coord.join()
        assert [v.fetch() for v in values] == [0, 1, 4, 9, 16]
        # A coordinator that takes the queue over dials with TLS as well.
        again = coordstore.ClusterCoordinator.attach([node.addr], "tls-queue", **tls)
        assert again.done()
    finally:
        stop.set()
        w.join(30)
    # Without a certificate nothing is reached.
    with pytest.raises(errors.CoordstoreError):
        coordstore.ClusterCoordinator([node.addr], "tls-queue", tls_ca=str(node.pki.servers))


def test_a_client_without_the_right_certificate_gets_nothing(node):
    def connect(**tls) -> None:
        coordstore.Agent([node.addr], "jax_worker", 0, retry_for=1.0, **tls).connect()

    ca = {"tls_ca": node.pki.servers}
    for tls in ({}, ca, {**ca, "tls_cert": node.stranger[0], "tls_key": node.stranger[1]}):
        with pytest.raises(errors.CoordstoreError):
            connect(**tls)
    with pytest.raises(ValueError, match="go together"):
        coordstore.Agent([node.addr], "jax_worker", 0, tls_ca=node.pki.servers, tls_cert=node.job[0])
    with pytest.raises(ValueError, match="needs tls_ca"):
        coordstore.Agent([node.addr], "jax_worker", 0, tls_cert=node.job[0], tls_key=node.job[1])
    with pytest.raises(ValueError, match="not a PEM file"):
        coordstore.Agent([node.addr], "jax_worker", 0, tls_ca=node.log.name)


class TcpStore:
    """A few ops of PyTorch's TCPStore protocol (docs/pytorch.md, Wire
    format), as torch's client sends them: keys get a "/" in front."""

    def __init__(self, addr: str) -> None:
        host, port = addr.rsplit(":", 1)
        self.s = socket.create_connection((host, int(port)), timeout=30)
        self.s.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE))  # VALIDATE
        self.s.sendall(b"\x0d" + struct.pack("<I", 7))  # PING
        assert self._read(4) == struct.pack("<I", 7)

    @staticmethod
    def _s(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b

    def _read(self, n: int) -> bytes:
        got = b""
        while len(got) < n:
            chunk = self.s.recv(n - len(got))
            if not chunk:
                raise ConnectionError("closed")
            got += chunk
        return got

    def set(self, key: str, value: bytes) -> None:
        self.s.sendall(b"\x01" + self._s(b"/" + key.encode()) + self._s(value))

    def get(self, key: str) -> bytes:
        self.s.sendall(b"\x03" + self._s(b"/" + key.encode()))
        (n,) = struct.unpack("<Q", self._read(8))
        return self._read(n)

    def close(self) -> None:
        self.s.close()


def test_namespaces_are_the_admins_and_the_relay_carries_plaintext_torch_over_tls(node):
    with pytest.raises(errors.PermissionDenied):
        coordstore.create_namespace([node.addr], "job-x", ttl_ms=600_000, **node.tls(node.job))
    made = coordstore.create_namespace([node.addr], "job-x", ttl_ms=600_000, **node.tls(node.ops))
    assert (made.name, made.settings) == ("job-x", {"tasks": 1, "ttl_ms": 600_000})
    with pytest.raises(errors.AlreadyExists):
        coordstore.create_namespace([node.addr], "job-x", **node.tls(node.ops))
    assert coordstore.get_namespace([node.addr], "job-x", **node.tls(node.job)).name == "job-x"

    # torch's client has no TLS: the node closes a plaintext TCPStore...
    with pytest.raises(OSError):
        TcpStore(node.addr).get("k")
    # ...and the relay, on loopback, carries it over TLS into the namespace.
    with coordstore.Relay([node.addr], namespace="job-x", **node.tls(node.job)) as relay:
        assert relay.address == f"127.0.0.1:{relay.port}"
        store = TcpStore(relay.address)
        store.set("rank0/id", b"over tls")
        assert store.get("rank0/id") == b"over tls"
        store.close()
    r = node.ctl("--namespace", "job-x", "kv", "ls", "--torch", "/rank0")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [{"key": "/rank0/id", "value": "over tls"}]
