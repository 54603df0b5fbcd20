"""Where the hub listens, and with which TLS material, for the backend's kind of agents.

unix: only the socket in the (0700) experiment directory; file permissions authenticate both
sides (only the experiment's owner can connect to it, or put a socket there), so it needs no TLS.
loopback: also 127.0.0.1 TCP for tunnels, always with TLS from the experiment's own CA: a worker's
end of a tunnel is a port any local user may bind once the SSH link drops, and an agent must
not hand its token to (or obey) whoever does. network: `hubBindAddress`:`hubPort` with TLS (the
experiment's own CA unless the user brings a certificate), advertised to agents as `nniManagerIp`
or through a backend's relay (`Backend[object].hub_route`); the port is kept in the store so a
restarted manager listens where running agents redial. The CA stays in the experiment
directory, so a restarted manager is trusted by the agents already running.
"""
from __future__ import annotations

import ipaddress
import os
import logging
from dataclasses import dataclass
from pathlib import Path

from nni_manager.backends.base import Backend
from nni_manager.config import ConfigError
from nni_manager.hub import Hub, TlsMaterial
from nni_manager.hub.address import bare_host, host_port
from nni_manager.hub.tls import experiment_tls, user_tls
from nni_manager.store import Store

log = logging.getLogger(__name__)
_KEY = "hub_address"


@dataclass(frozen=True)
class HubPlan:
    """Where the hub listens (`listen`, None: the Unix socket only), with which TLS material,
    and what agents are told to dial when that differs (`advertise`: a host, or host:port)."""

    listen: str | None
    tls: TlsMaterial | None
    advertise: str | None = None


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(bare_host(host)).is_loopback
    except ValueError:
        return host == "localhost"


def _every_interface(advertise: str) -> str:
    try:
        return "::" if ipaddress.ip_address(bare_host(advertise)).version == 6 else "0.0.0.0"
    except ValueError:  # a DNS name
        return "0.0.0.0"


def _user_tls(cert: Path, key: Path, ca: Path | None) -> TlsMaterial:
    """The certificate the user brings (hubCertFile, hubKeyFile, hubCaFile), or one line naming the
    field that cannot be read."""
    for field, path in (("hubCertFile", cert), ("hubKeyFile", key), ("hubCaFile", ca)):
        if path is not None and not os.access(path, os.R_OK):
            raise ConfigError(f"trainingService.{field}", f"cannot be read: {path}",
                              "give a readable PEM file (or remove hubCertFile and hubKeyFile: the experiment "
                              "then makes its own CA)")
    return user_tls(cert, key, ca)


async def plan(backend: Backend[object], store: Store, experiment_dir: Path, experiment_id: str) -> HubPlan:
    """Bind one address, advertise another: `hubBindAddress` (default every interface, or the
    advertised address itself when that is loopback), `nniManagerIp` (an address or DNS name
    agents dial: a public IP, a NAT port-forward, a Service name), or the backend's relay."""
    if backend.hub == "unix":
        return HubPlan(None, None)
    if backend.hub == "loopback":
        return HubPlan("127.0.0.1:0", experiment_tls(experiment_dir / "tls", ["127.0.0.1"], experiment_id))
    ts = backend.config.training_service
    if not ts.hub_tls:
        log.warning("trainingService.hubTls is false: agents talk to the hub in PLAIN TEXT (tokens, metrics and "
                    "code readable on the network); use it only on a network you trust")
    route = await backend.hub_route(experiment_id, experiment_dir)
    if route is not None:  # agents dial the backend's relay; the hub listens where only the relay's far end reaches
        try:
            host = bare_host(route.bind.rpartition(":")[0])
            tls = (experiment_tls(experiment_dir / "tls", [host, *route.names, *backend.hub_names()], experiment_id)
                   if ts.hub_tls else None)
            if ts.hub_tls and ts.hub_cert_file is not None and ts.hub_key_file is not None:
                tls = _user_tls(ts.hub_cert_file, ts.hub_key_file, ts.hub_ca_file)
        except BaseException:  # e.g. an unreadable hubCertFile: the relay just made must not outlive the refusal
            await backend.stop()
            raise
        return HubPlan(route.bind, tls, route.advertise)
    advertise = bare_host(ts.nni_manager_ip or await backend.manager_address() or "")
    if not advertise:
        raise ConfigError("nniManagerIp", f"is required for platform {backend.platform}",
                          "set it to an address or DNS name of this machine that the workers can reach")
    bind = bare_host(ts.hub_bind_address or (advertise if _is_loopback(advertise) else _every_interface(advertise)))
    port = ts.hub_port
    if port is None:
        remembered = store.setting(_KEY) if store is not None else None
        port = int(remembered.rpartition(":")[2]) if remembered and remembered.rpartition(":")[0] == host_port(bind, 0).rpartition(":")[0] else 0
    listen = host_port(bind, port)
    if not ts.hub_tls:
        return HubPlan(listen, None, advertise)
    if ts.hub_cert_file is not None and ts.hub_key_file is not None:
        return HubPlan(listen, _user_tls(ts.hub_cert_file, ts.hub_key_file, ts.hub_ca_file), advertise)
    names = [advertise, *([bind] if bind not in ("0.0.0.0", "::") else []), *backend.hub_names()]
    return HubPlan(listen, experiment_tls(experiment_dir / "tls", names, experiment_id), advertise)


async def listen_address(backend: Backend[object], store: Store, experiment_dir: Path,
                         experiment_id: str) -> tuple[str | None, TlsMaterial | None]:
    """(where the hub listens, its TLS material): `plan` without the advertised address."""
    p = await plan(backend, store, experiment_dir, experiment_id)
    return p.listen, p.tls


def remember(store: Store, hub: Hub) -> None:
    """Keep the bound address, so a restarted manager listens on the same port."""
    if hub.address:
        with store.transaction():
            store.set_setting(_KEY, hub.address)
