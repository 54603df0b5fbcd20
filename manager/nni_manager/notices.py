"""Warnings the user must see where they look, the console of `nni-manager run`, and not only in
log/nnimanager.log: each said once. `nni-manager run` shows the `nni_manager.console` logger on
stderr (`console_handler`); the log file gets it as any other warning.

The one kind so far: the manager cannot ship the agent's dependencies to a worker (no package index
and no agentWheelhouse), so the worker's agent fails at its boot step; the trials' message points
here (`DEPS_POINTER`)."""
from __future__ import annotations

import logging

from nni_manager.config import SecretFormatter

log = logging.getLogger("nni_manager.console")
_said: set[str] = set()
# the boot step's words for a dependency it lacks (nni_agent/boot.py `missing`)
_BOOT_LACKS = (" is missing", " is older than ", " is newer than the agent supports")
DEPS_POINTER = "the manager could not ship the agent's dependencies to it: see the console or log/nnimanager.log for the fix"


def say_once(key: str, message: str) -> None:
    """Warn on the console and in the log, once per `key` in this process."""
    if key in _said:
        return
    _said.add(key)
    log.warning("%s", message)


def deps_unshipped(where: str, why: str) -> None:
    say_once(f"deps:{where}", f"cannot ship the agent's dependencies to {where}; its agents will not start: {why}")


def explain_agent_failure(reason: str) -> str:
    """`reason` pointing at the console's notice, when dependencies could not be shipped and the
    agent's boot step says it lacks one."""
    if any(k.startswith("deps:") for k in _said) and any(w in reason for w in _BOOT_LACKS):
        return f"{reason} ({DEPS_POINTER})"
    return reason


def console_handler(secrets: set[str]) -> logging.Handler:
    """What `nni-manager run` adds to `nni_manager.console`: one line each on stderr."""
    import sys

    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(SecretFormatter("nni-manager: warning: %(message)s", secrets))
    return handler
