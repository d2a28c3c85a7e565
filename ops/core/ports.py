"""Can this machine listen on HOST:PORT? Asked before starting a part that would listen there.

A second `brigade up` (or a gateway on a port another program holds) must fail at once with a
line that says what to do, not hang, and not start workers on the shared queue first.
"""
from __future__ import annotations

import errno
import socket


class CannotListen(Exception):
    """HOST:PORT cannot be bound here: not an address of this machine, or not allowed."""


class PortInUse(CannotListen):
    """Another process listens on HOST:PORT."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for fleets started on one machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_free(host: str, port: int, setting: str = "BRIGADE_GATEWAY_PORT") -> None:
    """Raise PortInUse (or CannotListen) unless every address HOST resolves to can be bound at PORT.

    SO_REUSEADDR is set as servers set it (asyncio, uvicorn), so a port left in TIME_WAIT by a
    process that just stopped counts as free, while one that something listens on does not."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CannotListen(f"cannot listen on {host}:{port}: the host does not resolve ({exc.strerror})") from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise bind_error(host, port, exc, setting) from None


def bind_error(host: str, port: int, exc: OSError, setting: str = "BRIGADE_GATEWAY_PORT") -> CannotListen:
    """The error to show for a failed bind of HOST:PORT."""
    if exc.errno == errno.EADDRINUSE:
        return PortInUse(f"port {port} on {host} is in use (another Brigade?): stop it or set {setting}")
    return CannotListen(f"cannot listen on {host}:{port}: {exc.strerror}")

