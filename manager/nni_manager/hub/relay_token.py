"""The experiment's relay token: what a connection shows a relay in front of the hub (the Kubernetes
hub relay, the Slurm login-node relay) to prove it is one of this experiment's agents.

Agents get the token beside their own (a Secret, a 0600 file) and open every connection with an
HTTP CONNECT carrying it (`nni-agent --relay-token-file`); the relay holds only its sha256 (no
secret: a pod spec or an argv may show it) and pipes a connection to the hub, or spends anything
shared on it, only once the CONNECT proves the token (compared in constant time). Anyone else is
dropped at once. The token is made once per experiment (a restarted manager finds it again, so
relays and agents that outlive it keep working) and only proves membership to relays: the hub still
checks each agent's own token.
"""
from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

FILE = "relay.token"


def relay_token(experiment_dir: Path) -> str:
    """The experiment's relay token, made (0600, under the experiment's directory) on first use."""
    path = experiment_dir / FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        token = path.read_text().strip()
        if token:
            return token
        path.unlink()  # an empty file (a crash while writing): made again
        return relay_token(experiment_dir)
    with os.fdopen(fd, "w") as f:
        token = secrets.token_urlsafe(32)
        f.write(token + "\n")
    return token


def relay_digest(token: str) -> str:
    """What a relay is given to check the token with: its sha256, in hex."""
    return hashlib.sha256(token.encode()).hexdigest()
