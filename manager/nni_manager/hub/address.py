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
