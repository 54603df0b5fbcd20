"""The study's storage, served with Optuna's own gRPC storage proxy to the experiment's trials.

The manager opens the storage the user named (`optuna.storages.get_storage(url)`: SQLite,
PostgreSQL, MySQL) and serves Optuna's `StorageService` for it on a Unix socket in the
experiment directory, readable by the manager's user only. The hub (hub/study.py) hands it the
calls agents carry for their trials, byte for byte; Optuna's own servicer answers them, so every
storage call a trial makes behaves as with `optuna.storages.run_grpc_proxy_server`.
"""
from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from nni_manager.config import ConfigError

OPTUNA_SERVICE = "optuna.StorageService"
_MAX_MESSAGE = 64 * 1024 * 1024


def require_optuna() -> Any:
    """The optuna module, or one line saying how to get it."""
    try:
        import optuna
    except ImportError:
        raise ConfigError("optuna", "the `optuna` package is not installed next to nni-manager",
                          "`pip install optuna`") from None
    return optuna


def open_storage(url: str) -> Any:
    """`optuna.storages.get_storage(url)`, or a one-line ConfigError naming --storage."""
    optuna = require_optuna()
    try:
        return optuna.storages.get_storage(url)
    except Exception as exc:  # sqlalchemy / optuna say what is wrong with the URL
        first = redact_url(url, (str(exc).strip().splitlines() or [type(exc).__name__])[0])
        raise ConfigError("--storage", f"cannot open the study storage: {first}",
                          "pass an Optuna storage URL nni-manager can open, e.g. sqlite:///study.db") from None


def redact_url(url: str, text: str) -> str:
    """`text` without the URL's password (a driver's error may quote the URL whole)."""
    from urllib.parse import urlsplit

    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        from urllib.parse import unquote

        for form in sorted({password, unquote(password)}, key=len, reverse=True):  # as written, and decoded
            text = text.replace(form, "***")
    return text


class StorageProxy:
    """Optuna's storage servicer for `storage` on `socket_path`; `call` forwards one request."""

    def __init__(self, storage: Any, socket_path: Path) -> None:
        self.storage = storage
        self.socket_path = socket_path
        self._server: Any = None
        self._channel: grpc.aio.Channel | None = None

    async def start(self) -> None:
        from optuna.storages._grpc.auto_generated import api_pb2_grpc
        from optuna.storages._grpc.servicer import OptunaStorageProxyService

        self.socket_path.unlink(missing_ok=True)
        options = [("grpc.max_receive_message_length", _MAX_MESSAGE), ("grpc.max_send_message_length", _MAX_MESSAGE)]
        server = grpc.server(ThreadPoolExecutor(max_workers=8, thread_name_prefix="optuna-storage"), options=options)
        api_pb2_grpc.add_StorageServiceServicer_to_server(OptunaStorageProxyService(self.storage), server)
        old = os.umask(0o077)  # the socket is the manager user's alone
        try:
            if server.add_insecure_port(f"unix:{self.socket_path}") == 0:
                raise OSError(f"cannot listen on {self.socket_path}")
            server.start()
        finally:
            os.umask(old)
        self._server = server
        self._channel = grpc.aio.insecure_channel(f"unix:{self.socket_path}", options=options)

    async def call(self, method: str, request: bytes) -> bytes:
        assert self._channel is not None
        rpc = self._channel.unary_unary(f"/{OPTUNA_SERVICE}/{method}")
        return await rpc(request)

    async def stop(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(lambda: server.stop(1.0).wait())
        self.socket_path.unlink(missing_ok=True)
