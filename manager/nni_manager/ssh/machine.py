"""An SSH machine spec as NNI's `machineList` entries write it (v1 spellings too).

Shared by `remote` (each worker) and `slurm` (`loginNode`); each adds its own fields.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

from nni_manager.config import ConfigError, ConfigSection


@dataclass
class SshMachine:
    """How to reach one machine over SSH. Passwords and passphrases stay out of repr()."""

    host: str
    user: str
    port: int = 22
    password: str | None = field(default=None, repr=False)
    ssh_key_file: Path | None = None
    ssh_passphrase: str | None = field(default=None, repr=False)
    proxy_command: str | None = None  # like OpenSSH's ProxyCommand (%h, %p, %r substituted)
    known_hosts_file: Path | None = None  # default ~/.ssh/known_hosts
    strict_host_key_checking: bool = True


M = TypeVar("M", bound=SshMachine)


def parse_machine(m: ConfigSection, factory: Callable[..., M]) -> M:
    """Read the SSH fields of `m` into `factory(host=..., user=...)`; the caller reads its own
    fields and calls `m.finish()`."""
    host = m.str_("host", "ip", required=True)
    user = m.str_("user", "username", required=True)
    assert host is not None and user is not None
    machine = factory(host=host, user=user)
    port = m.int_("port", minimum=1)
    if port is not None:
        if port > 65535:
            raise ConfigError(m.at("port"), f"must be a TCP port (1-65535), got {port}", "use the SSH port, usually 22")
        machine.port = port
    machine.password = m.str_("password", "passwd")
    machine.ssh_key_file = m.path_("sshKeyFile", "sshKeyPath")
    if machine.ssh_key_file is not None and not machine.ssh_key_file.is_file():
        raise ConfigError(m.at("sshKeyFile"), f"{machine.ssh_key_file} does not exist",
                          "point it at your private key file, e.g. ~/.ssh/id_ed25519")
    machine.ssh_passphrase = m.str_("sshPassphrase", "passphrase")
    machine.proxy_command = m.str_("proxyCommand")
    machine.known_hosts_file = m.path_("knownHostsFile")
    strict = m.bool_("strictHostKeyChecking")
    if strict is not None:
        machine.strict_host_key_checking = strict
    return machine
