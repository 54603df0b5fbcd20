"""host:port for the hub, IPv6-safe: an agent's `--manager` and gRPC targets need `[fd00::5]:4000`
(an unbracketed `fd00::5:4000` is a different, wrong address), while certificates and sockets
need the bare host."""
from __future__ import annotations


def bare_host(host: str) -> str:
    """`[fd00::5]` -> `fd00::5`; other hosts unchanged (users may write either form)."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def host_port(host: str, port: int | str) -> str:
    """`host:port`, with an IPv6 literal in brackets."""
    host = bare_host(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def port_of(address: str) -> int | None:
    """The port an address names: `h:4000`, `[fd00::5]:4000` -> 4000; `h`, `fd00::5` -> None."""
    if address.startswith("["):
        rest = address.partition("]")[2]
        return int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if address.count(":") == 1 and address.rpartition(":")[2].isdigit():
        return int(address.rpartition(":")[2])
    return None


def advertised(advertise: str, bound_port: int | str) -> str:
    """What agents dial: `advertise` as is when it names a port (a relay's, a NAT's), else with
    the port the hub is bound to."""
    if port_of(advertise) is not None:
        return advertise
    return host_port(advertise, bound_port)
