"""Warnings the user must see where they look, the console of `nni-manager run`, and not only in
log/nnimanager.log: each said once. `nni-manager run` shows the `nni_manager.console` logger on
stderr (`console_handler`); the log file gets it as any other warning.

The kinds: the manager cannot ship the agent's dependencies to a worker (no package index and no
agentWheelhouse), so the worker's agent fails at its boot step; the trials' message points here
(`DEPS_POINTER`). Every backend that ships them gets there through agent_deps.resolve and
resolve_for_pythons, which say it, so no backend has its own copy. And shipped code someone else
changed or planted (aml_code). Each experiment starts afresh (`new_experiment`)."""
from __future__ import annotations

import logging

from nni_manager.config import SecretFormatter

log = logging.getLogger("nni_manager.console")
_said: set[str] = set()
# the boot step's words for a dependency it lacks (nni_agent/boot.py `missing`)
# ... and agent_deps' for a worker it has no wheels for (a remote machine's bootstrap says it)
_BOOT_LACKS = (" is missing", " is older than ", " is newer than the agent supports", "no wheel for ")
DEPS_POINTER = "the manager could not ship the agent's dependencies to it: see the console or log/nnimanager.log for the fix"


def say_once(key: str, message: str) -> None:
    """Warn on the console and in the log, once per `key` in this process."""
    if key in _said:
        return
    _said.add(key)
    log.warning("%s", message)


def deps_unshipped(where: str, why: str) -> None:
    say_once(f"deps:{where}", f"cannot ship the agent's dependencies to {where}; its agents will not start: {why}")


def new_experiment() -> None:
    """Each experiment says its notices once (a process may run several, through the Python API)."""
    _said.clear()


def explain_agent_failure(reason: str, started: bool = True) -> str:
    """`reason` pointing at the console's notice, when dependencies could not be shipped and the
    agent's boot step says it lacks one; or, for an agent that never `started` (connected) where
    the platform keeps the boot step's line in the job's own log (AML), when it may."""
    if not any(k.startswith("deps:") for k in _said) or DEPS_POINTER in reason:
        return reason
    if any(w in reason for w in _BOOT_LACKS):
        return f"{reason} ({DEPS_POINTER})"
    if not started:
        return f"{reason} (if the job's log says the agent lacks a dependency: {DEPS_POINTER})"
    return reason


def console_handler(secrets: set[str]) -> logging.Handler:
    """What `nni-manager run` adds to `nni_manager.console`: one line each on stderr."""
    import sys

    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(SecretFormatter("nni-manager: warning: %(message)s", secrets))
    return handler
