"""A relay (``coordstore relay``) inside this process, and the Node API's
namespace calls (``coordstore ctl ns create/get``).

Stock clients that cannot follow a failover themselves — torch's TCPStore,
jaxlib, TensorFlow — dial the relay's plaintext port on loopback; the relay
dials every node (over TLS when given) and re-issues each in-flight call at
a live node, exactly once, so the client survives any node's death.

>>> relay = Relay(["10.0.0.1:7470", "10.0.0.2:7470"], namespace="job42")  # doctest: +SKIP
>>> store = torch.distributed.TCPStore("127.0.0.1", relay.port)              # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional, Union

from . import _native

PathLike = Union[str, "os.PathLike[str]"]

# What the cluster takes as a namespace name: a DNS label.
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class Relay:
    """Relays every dialect (TCPStore, ``xla.coordination``,
    ``tensorflow``, tf.data) from ``listen`` (default: a free port on
    127.0.0.1; see :attr:`port`) to the nodes ``endpoints``
    (``HOST:PORT``), in ``namespace`` (``None``: the default one).

    ``tls_ca``, ``tls_cert``, ``tls_key``: as :class:`coordstore.Agent`'s;
    the relay's own port stays plaintext, so keep it on loopback. A call
    keeps trying nodes for ``retry_for`` seconds. :meth:`close` (or
    ``with``) stops accepting; the relay also ends with the process.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        namespace: Optional[str] = None,
        listen: str = "127.0.0.1:0",
        tls_ca: Optional[PathLike] = None,
        tls_cert: Optional[PathLike] = None,
        tls_key: Optional[PathLike] = None,
        retry_for: float = 600.0,
    ) -> None:
        self._r = _native.Relay(
            list(endpoints),
            listen=listen,
            namespace=namespace,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            retry_for_s=retry_for,
        )

    @property
    def address(self) -> str:
        """``HOST:PORT`` the relay serves on."""
        return self._r.address

    @property
    def port(self) -> int:
        return self._r.port

    def close(self, timeout: float = 5.0) -> None:
        """Stops accepting connections (those open are relayed on until
        their clients close them)."""
        self._r.close(timeout)

    def __enter__(self) -> "Relay":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Namespace:
    """A namespace: its name, its port (0: none, reached by name on the
    main port) and the settings read back (``tasks``, and ``ttl_ms``,
    ``max_keys``, ``max_bytes`` where set)."""

    name: str
    port: int
    settings: dict[str, int] = field(default_factory=dict)


def create_namespace(
    endpoints: Sequence[str],
    name: str,
    *,
    tasks: int = 1,
    ttl_ms: Optional[int] = None,
    max_keys: Optional[int] = None,
    max_bytes: Optional[int] = None,
    tls_ca: Optional[PathLike] = None,
    tls_cert: Optional[PathLike] = None,
    tls_key: Optional[PathLike] = None,
) -> Namespace:
    """Creates namespace ``name`` (``coordstore ctl ns create NAME --tasks
    N [--ttl-ms] [--max-keys] [--max-bytes]``). Raises
    :class:`~coordstore.errors.AlreadyExists` if it exists, and
    :class:`~coordstore.errors.PermissionDenied` for a client whose
    certificate is not an admin's (``--admin-client-name``) on a cluster
    with mutual TLS."""
    name, port, settings = _native.create_namespace(
        list(endpoints),
        name,
        tasks=tasks,
        ttl_ms=ttl_ms,
        max_keys=max_keys,
        max_bytes=max_bytes,
        tls_ca=tls_ca,
        tls_cert=tls_cert,
        tls_key=tls_key,
    )
    return Namespace(name, port, settings)


def get_namespace(
    endpoints: Sequence[str],
    name: str,
    *,
    tls_ca: Optional[PathLike] = None,
    tls_cert: Optional[PathLike] = None,
    tls_key: Optional[PathLike] = None,
) -> Namespace:
    """Namespace ``name`` (``coordstore ctl ns get``); raises
    :class:`~coordstore.errors.NotFound` if there is none."""
    name, port, settings = _native.get_namespace(
        list(endpoints), name, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
    )
    return Namespace(name, port, settings)


def is_namespace_name(name: str) -> bool:
    """Whether ``name`` can name a namespace: a DNS label, not ``default``."""
    return _LABEL.fullmatch(name) is not None and name != "default"


def namespace_name(job_id: str) -> str:
    """A namespace name for ``job_id``: the id itself if it is one (see
    :func:`is_namespace_name`), else its lower-cased letters, digits and
    dashes (at most 54) and 8 hex digits of its SHA-256, so two ids never
    meet in one namespace."""
    if is_namespace_name(job_id):
        return job_id
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:8]
    base = re.sub(r"[^a-z0-9]+", "-", job_id.lower()).strip("-")[:54].strip("-")
    return f"{base}-{digest}" if base else f"job-{digest}"
