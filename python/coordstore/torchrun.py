"""torchrun's rendezvous on coordstore, with no store on any training host:

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend coordstore \\
        --rdzv-endpoint node1:7470,node2:7470,node3:7470 --rdzv-id job42 train.py

The handler, registered under torchrun's entry point group
``torchrun.handlers`` (see ``pyproject.toml``; torch loads it in
``torch/distributed/elastic/rendezvous/registry.py``), does on each agent:

1. creates the job's namespace (named after ``--rdzv-id``, see
   :func:`coordstore.relay.namespace_name`) unless it exists: one task, the
   TTL and quotas of ``--rdzv-conf``, so the cluster deletes it once it has
   been quiet for the TTL;
2. starts a relay in this process on 127.0.0.1 (a free port) into that
   namespace, over every node given, so the agent and its workers ride
   through any node's death and reach a TLS cluster in plaintext on
   loopback only;
3. runs the rendezvous through the cluster's rendezvous service
   (:mod:`coordstore.rendezvous`; with ``rendezvous=c10d``, torch's own
   ``DynamicRendezvousHandler`` over a ``C10dRendezvousBackend``), with a
   ``TCPStore(is_master=False)`` client of the relay as the agents' store,
   and hands the workers the relay as their store too
   (``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT`` the relay's port,
   ``TORCHELASTIC_USE_AGENT_STORE=True``: every rank a client). No
   ``TCPStore`` server is started anywhere;
4. empties the workers' store at each round before any agent starts its
   workers (the rendezvous' keys kept), so a restarted worker group never
   reads the previous attempt's keys.

``--rdzv-conf`` keys (torchrun splits the string at commas):

* ``endpoints``: more nodes, ``;``-separated (``--rdzv-endpoint`` may list
  several, comma-separated); a node without a port has 7470.
* ``namespace``: the namespace's name (default: from ``--rdzv-id``).
* ``ttl_ms``, ``max_keys``, ``max_bytes``: the namespace's settings when
  this handler creates it.
* ``tls_ca``, ``tls_cert``, ``tls_key``: PEM files, as
  :class:`coordstore.Agent` takes them; each key left out is read from
  ``COORDSTORE_TLS_CA``, ``COORDSTORE_TLS_CERT``, ``COORDSTORE_TLS_KEY``.
  Creating the namespace on a cluster with mutual TLS takes an admin's
  certificate (``--admin-client-name``); without one the namespace must
  exist already (``coordstore ctl ns create``).
* ``read_timeout``: seconds, the agent store's timeout (default 60, as
  torch's c10d backend).
* ``rendezvous``: ``native`` (default: the cluster decides the rounds,
  :mod:`coordstore.rendezvous`; needs a cluster at journal level 5) or
  ``c10d`` (torch's own ``DynamicRendezvousHandler`` over one
  compare-and-set key, as ``--rdzv-backend c10d`` does).
* torch's own: ``join_timeout``, ``last_call_timeout``, ``close_timeout``,
  ``heartbeat_timeout``, ``keep_alive_interval``, ``keep_alive_max_attempt``,
  ``cas_backoff_max_seconds``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Optional

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
)
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from ._native import Rendezvous
from .errors import AlreadyExists, NotFound, PermissionDenied
from .rendezvous import NativeRendezvousHandler
from .rendezvous import handler_options as native_options
from .relay import Relay, create_namespace, get_namespace, is_namespace_name, namespace_name

__all__ = ["BACKEND", "CoordstoreRendezvousHandler", "Settings", "create_handler", "handler"]

BACKEND = "coordstore"
DEFAULT_PORT = 7470
LOOPBACK = "127.0.0.1"
TLS_KEYS = ("tls_ca", "tls_cert", "tls_key")


def handler() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """The entry point (``torchrun.handlers``: ``coordstore``): torch calls
    it with no argument for the handler's creator."""
    return create_handler


def _int(params: RendezvousParameters, key: str) -> Optional[int]:
    return params.get_as_int(key)


def _endpoints(params: RendezvousParameters) -> list[str]:
    given = [e for e in params.endpoint.split(",") if e.strip()]
    given += [e for e in str(params.get("endpoints", "")).split(";") if e.strip()]
    if not given:
        raise ValueError(
            "the coordstore rendezvous needs a node: --rdzv-endpoint HOST:PORT[,HOST:PORT...]"
        )
    out: list[str] = []
    for e in given:
        host, port = parse_rendezvous_endpoint(e.strip(), default_port=DEFAULT_PORT)
        addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if addr not in out:
            out.append(addr)
    return out


@dataclass
class Settings:
    """What the handler takes from torchrun's rendezvous parameters."""

    endpoints: list[str]
    namespace: str
    tls: dict[str, str] = field(default_factory=dict)
    ttl_ms: Optional[int] = None
    max_keys: Optional[int] = None
    max_bytes: Optional[int] = None
    read_timeout: int = 60

    @classmethod
    def from_params(cls, params: RendezvousParameters) -> "Settings":
        namespace = str(params.get("namespace") or namespace_name(params.run_id))
        if not is_namespace_name(namespace):
            raise ValueError(f"namespace={namespace!r}: a namespace is a DNS label, not 'default'")
        tls = {}
        for key in TLS_KEYS:
            value = params.get(key) or os.environ.get(f"COORDSTORE_{key.upper()}")
            if value:
                tls[key] = str(value)
        read_timeout = params.get_as_int("read_timeout", 60)
        if read_timeout is None or read_timeout <= 0:
            raise ValueError("read_timeout is a positive number of seconds")
        return cls(
            endpoints=_endpoints(params),
            namespace=namespace,
            tls=tls,
            ttl_ms=_int(params, "ttl_ms"),
            max_keys=_int(params, "max_keys"),
            max_bytes=_int(params, "max_bytes"),
            read_timeout=read_timeout,
        )


def ensure_namespace(s: Settings) -> None:
    """Creates the job's namespace unless it exists (any agent may be the
    first; the others find it made)."""
    try:
        create_namespace(
            s.endpoints,
            s.namespace,
            tasks=1,
            ttl_ms=s.ttl_ms,
            max_keys=s.max_keys,
            max_bytes=s.max_bytes,
            **s.tls,
        )
    except AlreadyExists:
        pass
    except PermissionDenied as denied:
        # Not an admin: the launcher must have made it.
        try:
            get_namespace(s.endpoints, s.namespace, **s.tls)
        except (NotFound, PermissionDenied):
            raise RendezvousError(
                f"coordstore refused to create namespace {s.namespace!r} ({denied.message}) "
                f"and it does not exist: create it as an admin (coordstore ctl ns create "
                f"{s.namespace} --tasks 1) or give the handler an admin's certificate"
            ) from denied


def empty_workers_store(
    agent_store: TCPStore, run_id: str, info: RendezvousInfo, wait: timedelta
) -> None:
    """Each round's workers find their store empty, as a store of their
    own would be: node-rank 0 deletes every key but the rendezvous'
    (``torch.rendezvous.<run id>`` and under it) and the other agents
    wait for it before they start their workers. Every agent stopped
    its workers before it joined the round. Without this, a restarted
    worker group reads the previous attempt's keys (gloo's addresses)
    and dials dead peers: stock torch 2.15's shared store does just
    that (``docs/pytorch.md``, torchrun)."""
    done = "coordstore/workers_store_emptied"
    if info.rank != 0:
        info.store.wait([done], wait)
        return
    rendezvous = f"torch.rendezvous.{run_id}"
    for key in agent_store.list_keys():
        if key != rendezvous and not key.startswith(rendezvous + "."):
            agent_store.delete_key(key)
    info.store.set(done, b"1")


class _RelayAsServer:
    """Stands for the TCPStore server torch's handler would start for the
    workers: only its ``port`` is read."""

    def __init__(self, port: int) -> None:
        self.port = port


class CoordstoreRendezvousHandler(DynamicRendezvousHandler):
    """torch's ``DynamicRendezvousHandler`` (join, last call, heartbeats,
    re-rendezvous) with the relay as the store of both the rendezvous and
    the workers. Made by :func:`create_handler`."""

    _relay: Optional[Relay] = None
    _agent_store: Optional[TCPStore] = None
    _workers_store: Optional[RendezvousStoreInfo] = None

    def _use_relay(self, relay: Relay, store: TCPStore) -> None:
        self._relay = relay
        self._agent_store = store
        self._workers_store = RendezvousStoreInfo(LOOPBACK, relay.port)
        # torch 2.15's next_rendezvous (sharing on, its default) starts a
        # TCPStore server on node-rank 0 for the workers and swaps its
        # address through the round's store, once: both are skipped when
        # these two are set. (Private names: if a later torch renames them,
        # the overrides below still keep every store on the relay.)
        self._bootstrap_store_info = self._workers_store
        self._shared_tcp_store_server = _RelayAsServer(relay.port)  # type: ignore[assignment]

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        """Every worker a client of ``MASTER_ADDR:MASTER_PORT`` (the relay),
        whatever ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` says."""
        return True

    def _create_tcp_store_server(self, master_addr: Any, master_port: Any) -> Any:
        assert self._relay is not None
        return _RelayAsServer(self._relay.port)

    def next_rendezvous(self) -> RendezvousInfo:
        info = super().next_rendezvous()
        assert self._workers_store is not None
        self._empty_workers_store(info)
        return RendezvousInfo(info.store, info.rank, info.world_size, self._workers_store)

    def _empty_workers_store(self, info: RendezvousInfo) -> None:
        assert self._agent_store is not None
        empty_workers_store(self._agent_store, self.settings.run_id, info, self.settings.timeout.join)

    def shutdown(self) -> bool:
        try:
            return super().shutdown()
        finally:
            if self._relay is not None:
                self._relay.close()

    @property
    def relay(self) -> Optional[Relay]:
        """The relay the agent and its workers dial."""
        return self._relay


def _timeout(params: RendezvousParameters, key: str) -> Optional[timedelta]:
    seconds = params.get_as_int(f"{key}_timeout")
    return None if seconds is None else timedelta(seconds=seconds)


def _handler_options(params: RendezvousParameters) -> dict[str, Any]:
    """torch's own rendezvous options, read as its ``create_handler`` does."""
    options: dict[str, Any] = {
        "timeout": RendezvousTimeout(
            _timeout(params, "join"),
            _timeout(params, "last_call"),
            _timeout(params, "close"),
            _timeout(params, "heartbeat"),
        ),
        "keep_alive_interval": params.get_as_int("keep_alive_interval", 5),
        "keep_alive_max_attempt": params.get_as_int("keep_alive_max_attempt", 3),
    }
    backoff = params.get("cas_backoff_max_seconds")
    if backoff is not None:
        options["cas_backoff_max_seconds"] = float(backoff)
    return options


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The rendezvous handler of ``--rdzv-backend coordstore``."""
    s = Settings.from_params(params)
    kind = str(params.get("rendezvous", "native"))
    if kind not in ("native", "c10d"):
        raise ValueError(f"rendezvous={kind!r}: native or c10d")
    ensure_namespace(s)
    relay = Relay(s.endpoints, namespace=s.namespace, **s.tls)
    try:
        store = TCPStore(
            LOOPBACK,
            relay.port,
            is_master=False,
            multi_tenant=True,
            timeout=timedelta(seconds=s.read_timeout),
        )
        if kind == "native":
            return _native_handler(params, s, relay, store)
        backend = C10dRendezvousBackend(store, params.run_id)
        h = CoordstoreRendezvousHandler.from_backend(
            params.run_id,
            store,
            backend,
            params.min_nodes,
            params.max_nodes,
            params.local_addr,
            **_handler_options(params),
        )
    except BaseException:
        relay.close()
        raise
    assert isinstance(h, CoordstoreRendezvousHandler)
    h._use_relay(relay, store)
    return h


def _native_handler(
    params: RendezvousParameters, s: Settings, relay: Relay, store: TCPStore
) -> NativeRendezvousHandler:
    """The native handler: the cluster's rendezvous, the relay as every store."""
    options = native_options(params)
    join = timedelta(seconds=options["timeouts"].join)
    return NativeRendezvousHandler(
        backend=BACKEND,
        run_id=params.run_id,
        rendezvous=Rendezvous(s.endpoints, params.run_id, namespace=s.namespace, **s.tls),
        store=store,
        workers_store=RendezvousStoreInfo(LOOPBACK, relay.port),
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        local_addr=params.local_addr,
        on_round=lambda info: empty_workers_store(store, params.run_id, info, join),
        on_shutdown=relay.close,
        **options,
    )


def _register() -> None:
    """Registers the backend when this module is imported before torch's
    registry loaded the entry points (which then finds this module
    half-made and skips it)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    try:
        rendezvous_handler_registry.register(BACKEND, create_handler)
    except ValueError:
        pass  # registered already (by the entry point: the same function)


_register()
