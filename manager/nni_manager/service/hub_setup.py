"""Where the hub listens, and with which TLS material, for the backend's kind of agents.

unix: only the socket in the (0700) experiment directory. loopback: also 127.0.0.1 TCP, for
tunnels. network: `nniManagerIp`:`hubPort` with TLS (the experiment's own CA unless the
user brings a certificate); the port is kept in the store so a restarted manager listens
where running agents redial.
"""
from __future__ import annotations

import logging
from pathlib import Path

from nni_manager.backends.base import Backend
from nni_manager.config import ConfigError
from nni_manager.hub import Hub, TlsMaterial
from nni_manager.hub.tls import experiment_tls, user_tls
from nni_manager.store import Store

log = logging.getLogger(__name__)
_KEY = "hub_address"


async def listen_address(backend: Backend, store: Store, experiment_dir: Path,
                         experiment_id: str) -> tuple[str | None, TlsMaterial | None]:
    if backend.hub == "unix":
        return None, None
    if backend.hub == "loopback":
        return "127.0.0.1:0", None
    ts = backend.config.training_service
    host = ts.nni_manager_ip or await backend.manager_address()
    if not host:
        raise ConfigError("nniManagerIp", f"is required for platform {backend.platform}",
                          "set it to an address of this machine that the workers can reach")
    port = ts.hub_port
    if port is None:
        remembered = store.setting(_KEY)
        port = int(remembered.rpartition(":")[2]) if remembered and remembered.rpartition(":")[0] == host else 0
    if not ts.hub_tls:
        log.warning("trainingService.hubTls is false: agents talk to the hub in PLAIN TEXT (tokens, metrics and "
                    "code readable on the network); use it only on a network you trust")
        return f"{host}:{port}", None
    if ts.hub_cert_file is not None and ts.hub_key_file is not None:
        return f"{host}:{port}", user_tls(ts.hub_cert_file, ts.hub_key_file, ts.hub_ca_file)
    return f"{host}:{port}", experiment_tls(experiment_dir / "tls", [host, *backend.hub_names()], experiment_id)


def remember(store: Store, hub: Hub) -> None:
    """Keep the bound address, so a restarted manager listens on the same port."""
    if hub.address:
        with store.transaction():
            store.set_setting(_KEY, hub.address)
