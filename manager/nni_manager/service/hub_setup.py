"""Where the hub listens, and with which TLS material, for the backend's kind of agents.

unix: only the socket in the (0700) experiment directory; file permissions authenticate both
sides (only the experiment's owner can connect to it, or put a socket there), so it needs no TLS.
loopback: also 127.0.0.1 TCP for tunnels, always with TLS from the experiment's own CA: a worker's
end of a tunnel is a port any local user may bind once the SSH link drops, and an agent must
not hand its token to (or obey) whoever does. network: `nniManagerIp`:`hubPort` with TLS (the
experiment's own CA unless the user brings a certificate); the port is kept in the store so a
restarted manager listens where running agents redial. The CA stays in the experiment
directory, so a restarted manager is trusted by the agents already running.
"""
from __future__ import annotations

import logging
from pathlib import Path

from nni_manager.backends.base import Backend
from nni_manager.config import ConfigError
from nni_manager.hub import Hub, TlsMaterial
from nni_manager.hub.address import bare_host, host_port
from nni_manager.hub.tls import experiment_tls, user_tls
from nni_manager.store import Store

log = logging.getLogger(__name__)
_KEY = "hub_address"


async def listen_address(backend: Backend, store: Store, experiment_dir: Path,
                         experiment_id: str) -> tuple[str | None, TlsMaterial | None]:
    if backend.hub == "unix":
        return None, None
    if backend.hub == "loopback":
        return "127.0.0.1:0", experiment_tls(experiment_dir / "tls", ["127.0.0.1"], experiment_id)
    ts = backend.config.training_service
    host = bare_host(ts.nni_manager_ip or await backend.manager_address() or "")
    if not host:
        raise ConfigError("nniManagerIp", f"is required for platform {backend.platform}",
                          "set it to an address of this machine that the workers can reach")
    port = ts.hub_port
    if port is None:
        remembered = store.setting(_KEY)
        port = int(remembered.rpartition(":")[2]) if remembered and remembered.rpartition(":")[0] == host_port(host, 0).rpartition(":")[0] else 0
    if not ts.hub_tls:
        log.warning("trainingService.hubTls is false: agents talk to the hub in PLAIN TEXT (tokens, metrics and "
                    "code readable on the network); use it only on a network you trust")
        return host_port(host, port), None
    if ts.hub_cert_file is not None and ts.hub_key_file is not None:
        return host_port(host, port), user_tls(ts.hub_cert_file, ts.hub_key_file, ts.hub_ca_file)
    return host_port(host, port), experiment_tls(experiment_dir / "tls", [host, *backend.hub_names()], experiment_id)


def remember(store: Store, hub: Hub) -> None:
    """Keep the bound address, so a restarted manager listens on the same port."""
    if hub.address:
        with store.transaction():
            store.set_setting(_KEY, hub.address)
