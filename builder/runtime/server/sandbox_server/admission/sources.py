"""Who a connection comes from, and each source's share of a limit.

A source is the client's IP address, except that every connection made on this host (this
network namespace: the sandbox's own code) is one source, ``local``: loopback addresses, and any
address the host owns, such as the pod's IP, through which code in the sandbox reaches the
server as easily as through 127.0.0.1. An address is the host's own when it is the address the
connection came in on, or when a socket can be bound to it (the kernel's own rule, no interface
list to parse; the answer is cached). Where ``ip_nonlocal_bind`` lets any address be bound, only
the first rule is used, so outside clients are never taken for local ones. IPv4-mapped IPv6
addresses count as their IPv4 address.

Shares keep one source from holding everything: the platform's router (another source) always
finds connections and command slots that the sandbox's own code, however it misbehaves, cannot
take.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from typing import Any

LOCAL = "local"
CACHE_SIZE = 4096  # addresses whose ownership is remembered (cleared when full)
NONLOCAL_BIND = (  # (IP version, the sysctl that lets it bind any address)
    (4, "/proc/sys/net/ipv4/ip_nonlocal_bind"),
    (6, "/proc/sys/net/ipv6/ip_nonlocal_bind"),
)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def ip_of(socket_address: Any) -> IPAddress | None:
    """The IP of a socket address (IPv4-mapped IPv6 as IPv4); None for anything else."""
    host = socket_address[0] if isinstance(socket_address, tuple) else socket_address
    try:
        address = ipaddress.ip_address(str(host).partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def binds_anything(sysctl: str) -> bool:
    """Whether this host lets a socket bind to addresses it does not own."""
    try:
        with open(sysctl, "rb") as handle:
            return handle.read().strip() != b"0"
    except OSError:
        return False


class Sources:
    """Maps a connection's addresses to its source, ``local`` for this host's own addresses."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._own: dict[str, bool] = {}
        self._bind_test = {version: not binds_anything(path) for version, path in NONLOCAL_BIND}

    def of(self, client_address: Any, server_address: Any) -> str:
        """The source of a connection from ``client_address`` to ``server_address``."""
        address = ip_of(client_address)
        if address is None:
            return str(client_address)
        if address.is_loopback or address == ip_of(server_address) or self._is_own(address):
            return LOCAL
        return str(address)

    def _is_own(self, address: IPAddress) -> bool:
        if not self._bind_test[address.version]:
            return False
        host = str(address)
        with self._lock:
            known = self._own.get(host)
        if known is not None:
            return known
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((host, 0))
            own = True
        except OSError:  # EADDRNOTAVAIL: not an address of this host
            own = False
        with self._lock:
            if len(self._own) >= CACHE_SIZE:
                self._own.clear()
            self._own[host] = own
        return own


class Shares:
    """How much of one limit each source holds: at most ``limit`` each (and in all, for the
    single source ``""`` of a global limit)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}

    def take(self, source: str) -> bool:
        """One more for ``source``, unless it holds its whole share already."""
        with self._lock:
            held = self._held.get(source, 0)
            if held >= self.limit:
                return False
            self._held[source] = held + 1
            return True

    def give_back(self, source: str) -> None:
        with self._lock:
            held = self._held.get(source, 0) - 1
            if held > 0:
                self._held[source] = held
            else:
                self._held.pop(source, None)

    def held(self, source: str) -> int:
        with self._lock:
            return self._held.get(source, 0)
