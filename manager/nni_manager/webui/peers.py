"""Which local user is on the other end of a loopback TCP connection.

TCP has no SO_PEERCRED, but Linux lists every socket of this network namespace in
/proc/net/tcp and /proc/net/tcp6 with its owner's uid: the client's socket is the entry whose
local end is our peer's (address, port) and whose remote end is our own. That lets the REST
server serve the user who started it and refuse the other users of a shared login node.
"""
from __future__ import annotations

import ipaddress
import struct
from pathlib import Path

_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def normal_address(host: str) -> Address | None:
    """`host` as an address, IPv4-mapped IPv6 (`::ffff:127.0.0.1`) as IPv4; None if not one."""
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def is_loopback(host: str) -> bool:
    addr = normal_address(host)
    return addr is not None and addr.is_loopback


def owners_known() -> bool:
    """Whether this system lists socket owners (Linux's /proc/net/tcp)."""
    return _TABLES[0].is_file()


def _decode(field: str) -> tuple[Address, int]:
    """`0100007F:1F90` (host-order 32-bit words in hex, then the port) -> (address, port)."""
    hex_addr, hex_port = field.split(":")
    raw = b"".join(struct.pack("=I", int(hex_addr[i:i + 8], 16)) for i in range(0, len(hex_addr), 8))
    addr = ipaddress.ip_address(raw)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr, int(hex_port, 16)


def socket_owner(peer: tuple[str, int], ours: tuple[str, int]) -> int | None:
    """The uid owning the socket whose local end is `peer` and remote end `ours`; None when no
    such socket is listed (not Linux, another namespace, or the connection is gone)."""
    want_peer, want_ours = (normal_address(peer[0]), peer[1]), (normal_address(ours[0]), ours[1])
    if want_peer[0] is None or want_ours[0] is None:
        return None
    port_hex = f":{peer[1]:04X}"  # a cheap filter before decoding addresses
    for table in _TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or not fields[1].endswith(port_hex):
                continue
            try:
                if _decode(fields[1]) == want_peer and _decode(fields[2]) == want_ours:
                    return int(fields[7])
            except ValueError:
                continue
    return None
