"""`pytest -p tests.support.system_audit -m "not system"`: a test not marked `system` that starts a
process (subprocess, fork) or a server (a listening socket, a gRPC server) fails, naming what it
started, so the `system` marker (tests/support/system_marker.py) stays true as tests are added."""
from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

_current: list[pytest.Item | None] = [None]


class StartedProcess(AssertionError):
    pass


def _check(what: str) -> None:
    item = _current[0]
    if item is not None and item.get_closest_marker("system") is None:
        raise StartedProcess(f"{item.nodeid} is not marked `system` but starts {what}: add it to "
                             "tests/support/system_marker.py (or use a system fixture)")


def _wrap(owner: Any, name: str, what: str) -> None:
    original = getattr(owner, name)

    def guarded(*args: Any, **kwargs: Any) -> Any:
        _check(what)
        return original(*args, **kwargs)

    setattr(owner, name, guarded)


def pytest_configure(config: pytest.Config) -> None:
    _wrap(subprocess.Popen, "_execute_child", "a process")
    _wrap(os, "fork", "a process (fork)")
    _wrap(socket.socket, "listen", "a server (listen)")
    try:
        import grpc.aio
    except ImportError:
        return
    _wrap(grpc, "server", "a gRPC server")
    _wrap(grpc.aio, "server", "a gRPC server")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _current[0] = item
    try:
        yield
    finally:
        _current[0] = None
