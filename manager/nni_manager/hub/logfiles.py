"""The trial log files the hub writes agents' LogChunks into, off the event loop.

A chunk carries its offset in the file, so a chunk replayed after a reconnect rewrites the same
bytes. Writes run on a worker thread (a slow or full disk never holds the loop that answers
1,000 agents), and the most recently used files stay open instead of an open and close per chunk.

An agent's offsets are contiguous, so a chunk may only rewrite bytes or append at the file's
end, and no file grows past MAX_LOG_BYTES: an agent cannot make sparse multi-terabyte files
or fill the manager's disk through one trial's log. Refused chunks are logged once per file.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

LogWrite = tuple[Path, int, bytes]  # (file, offset, data)
log = logging.getLogger(__name__)
MAX_LOG_BYTES = 1 << 30  # of one streamed log file on the manager; the trial's own file is whole on its agent


class LogFiles:
    def __init__(self, keep_open: int = 64) -> None:
        self._keep_open = keep_open
        self._fds: OrderedDict[Path, int] = OrderedDict()
        self._lock = threading.Lock()  # several sessions' batches may be written at once
        self._warned: set[Path] = set()

    def write(self, writes: list[LogWrite]) -> None:
        """Write the chunks (blocking: call it in a worker thread). OSError as os raises it."""
        with self._lock:
            for path, offset, data in writes:
                fd = self._open(path)
                data = self._bounded(path, os.fstat(fd).st_size, offset, data)
                while data:  # a short write (a nearly full disk) goes on, or raises
                    written = os.pwrite(fd, data, offset)
                    offset, data = offset + written, data[written:]

    def _bounded(self, path: Path, size: int, offset: int, data: bytes) -> bytes:
        """What of a chunk may be written: nothing past the end (a gap), nothing past MAX_LOG_BYTES."""
        if offset > size:
            self._warn(path, f"a chunk at offset {offset} leaves a gap after its {size} bytes (an agent's chunks "
                             "follow each other): dropped")
            return b""
        room = MAX_LOG_BYTES - offset
        if len(data) > room:
            self._warn(path, f"it reached {MAX_LOG_BYTES} bytes, the most kept on the manager: the rest is only in "
                             "the trial's own directory on its agent")
            return data[:max(0, room)]
        return data

    def _warn(self, path: Path, why: str) -> None:
        if path not in self._warned:
            self._warned.add(path)
            log.warning("trial log %s: %s", path, why)

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
