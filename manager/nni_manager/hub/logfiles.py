"""The trial log files the hub writes agents' LogChunks into, off the event loop.

A chunk carries its offset in the file, so a chunk replayed after a reconnect rewrites the same
bytes. Writes run on a worker thread (a slow or full disk never holds the loop that answers
1,000 agents), and the most recently used files stay open instead of an open and close per chunk.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

LogWrite = tuple[Path, int, bytes]  # (file, offset, data)


class LogFiles:
    def __init__(self, keep_open: int = 64) -> None:
        self._keep_open = keep_open
        self._fds: OrderedDict[Path, int] = OrderedDict()
        self._lock = threading.Lock()  # several sessions' batches may be written at once

    def write(self, writes: list[LogWrite]) -> None:
        """Write the chunks (blocking: call it in a worker thread). OSError as os raises it."""
        with self._lock:
            for path, offset, data in writes:
                os.pwrite(self._open(path), data, offset)

    def close(self) -> None:
        with self._lock:
            while self._fds:
                os.close(self._fds.popitem()[1])

    def _open(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._fds[path] = fd
        if len(self._fds) > self._keep_open:
            os.close(self._fds.popitem(last=False)[1])
        return fd
