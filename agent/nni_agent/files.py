"""Serve a trial's files to the manager over the stream (NNI's getTrialFile / fetchTrialOutput).

The manager may be on another machine than the trial (SSH, clusters), so it asks the agent:
a `FileRequest` names a path relative to the trial's directory (NNI_SYS_DIR); the answer is
a sequence of `FileChunk`s. Whatever the request says, nothing outside that directory is
read: absolute names and `..` are refused, the resolved path must stay inside, and every
file is opened without following a final symlink and checked again after opening (through
/proc/self/fd), so a trial that swaps a directory for a symlink mid-transfer gains nothing.
Directory downloads skip symlinks altogether. Sizes are checked before anything is sent,
so a request over its limit is refused at once instead of being cut off halfway.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Awaitable, Callable

from nni_agent.compat import to_thread
from nni_agent.v1 import agent_pb2 as pb

if TYPE_CHECKING:
    from nni_agent.keeper import Keeper

CHUNK_SIZE = 256 * 1024
DEFAULT_MAX_BYTES = 1 << 30  # when the request gives no limit
MAX_FILES = 100_000

Send = Callable[[pb.AgentMessage], Awaitable[None]]  # typing.Callable: subscriptable at run time on 3.8


class FileRefused(Exception):
    """The request cannot be served; `code` is a pb.FileError value."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class _Planned:
    name: str  # relative, '/'-separated: where the manager puts it
    path: Path  # on this machine
    size: int


def _safe_component(value: str) -> bool:
    return bool(value) and "/" not in value and value not in (".", "..") and "\x00" not in value


def trial_directory(keeper: Keeper, experiment_id: str, trial_id: str) -> Path:
    """The trial's directory on this agent: the live trial's own, else where a trial of this
    experiment is put by default (a trial that ran before the agent restarted)."""
    if not _safe_component(trial_id):
        raise FileRefused(pb.FILE_ERROR_UNKNOWN_TRIAL, f"invalid trial id {trial_id!r}")
    trial = keeper.trials.get(trial_id)
    if trial is not None:
        return Path(trial.sys_dir)
    if _safe_component(experiment_id):
        default = keeper.work_dir / experiment_id / "trials" / trial_id
        if default.is_dir():
            return default
    raise FileRefused(pb.FILE_ERROR_UNKNOWN_TRIAL, f"trial {trial_id} has no directory on this agent")


def _inside(root: str, path: str) -> bool:
    return path == root or os.path.commonpath([root, path]) == root


def confine(root: Path, name: str) -> tuple[str, Path]:
    """(resolved root, resolved target) for `name` relative to `root`; refuses names that
    leave it, by their spelling or by a symlink."""
    if "\x00" in name or "\\" in name:
        raise FileRefused(pb.FILE_ERROR_NOT_ALLOWED, f"{name!r}: not a plain relative path")
    rel = PurePosixPath(name or ".")
    if rel.is_absolute() or ".." in rel.parts:
        raise FileRefused(pb.FILE_ERROR_NOT_ALLOWED,
                          f"{name!r} is outside the trial directory: give a path relative to it, without '..'")
    real_root = os.path.realpath(root)
    if not os.path.isdir(real_root):
        raise FileRefused(pb.FILE_ERROR_UNKNOWN_TRIAL, f"the trial directory {root} does not exist on this agent")
    target = os.path.realpath(os.path.join(real_root, *rel.parts))
    if not _inside(real_root, target):
        raise FileRefused(pb.FILE_ERROR_NOT_ALLOWED,
                          f"{name!r} leads outside the trial directory (through a symlink); it is not served")
    return real_root, Path(target)


def plan(root: Path, name: str, recursive: bool, max_bytes: int) -> tuple[str, list[_Planned]]:
    """The files to send and their sizes, or FileRefused. For a directory (`recursive`), names
    are relative to it; a single file keeps the name it was asked by."""
    real_root, target = confine(root, name)
    try:
        st = target.lstat()
    except FileNotFoundError:
        raise FileRefused(pb.FILE_ERROR_NOT_FOUND, f"no {name or '.'} in the trial directory") from None
    files: list[_Planned] = []
    if stat.S_ISDIR(st.st_mode):
        if not recursive:
            raise FileRefused(pb.FILE_ERROR_NOT_FOUND,
                              f"{name or '.'} is a directory: download it with download_trial_directory")
        for dirpath, dirnames, filenames in os.walk(target, followlinks=False):
            dirnames.sort()
            for fname in sorted(filenames):
                path = Path(dirpath, fname)
                try:
                    fst = path.lstat()
                except OSError:
                    continue  # vanished meanwhile
                if not stat.S_ISREG(fst.st_mode):
                    continue  # symlinks, sockets, fifos: never followed or read
                files.append(_Planned(path.relative_to(target).as_posix(), path, fst.st_size))
                if len(files) > MAX_FILES:
                    raise FileRefused(pb.FILE_ERROR_TOO_LARGE,
                                      f"{name or 'the trial directory'} holds more than {MAX_FILES} files")
    elif stat.S_ISREG(st.st_mode):
        files.append(_Planned(PurePosixPath(name).as_posix(), target, st.st_size))
    else:
        raise FileRefused(pb.FILE_ERROR_NOT_FOUND, f"{name} is not a regular file")
    total = sum(f.size for f in files)
    if total > max_bytes:
        raise FileRefused(pb.FILE_ERROR_TOO_LARGE,
                          f"{name or 'the trial directory'} is {total} bytes, over the limit of {max_bytes} bytes")
    return real_root, files


def open_confined(real_root: str, path: Path) -> int:
    """Open `path` for reading without following a symlink in its last component, then check
    where the descriptor really points (a parent swapped for a symlink after `plan`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise FileRefused(pb.FILE_ERROR_NOT_FOUND, f"{path.name} disappeared before it could be read") from None
    except OSError as exc:
        if exc.errno == getattr(os, "ELOOP", -1):
            raise FileRefused(pb.FILE_ERROR_NOT_ALLOWED, f"{path.name} became a symlink; it is not served") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileRefused(pb.FILE_ERROR_NOT_FOUND, f"{path.name} is not a regular file")
        try:
            really = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            really = None  # no /proc: the realpath check in `confine` stands
        if really is not None and not _inside(real_root, really):
            raise FileRefused(pb.FILE_ERROR_NOT_ALLOWED, f"{path.name} leads outside the trial directory")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read(fd: int, size: int) -> bytes:
    return os.read(fd, size)


async def serve(request: pb.FileRequest, root: Path | None, send: Send, refusal: FileRefused | None = None) -> None:
    """Answer one FileRequest through `send` (which applies back-pressure): chunks of each
    file in order, then a final message with `last` (and `error` if it failed)."""
    rid = request.request_id

    async def finish(code: int = pb.FILE_ERROR_NONE, message: str = "") -> None:
        await send(pb.AgentMessage(file_chunk=pb.FileChunk(request_id=rid, last=True, error=code,  # type: ignore[arg-type]
                                                           message=message)))

    if refusal is not None or root is None:
        refusal = refusal or FileRefused(pb.FILE_ERROR_UNKNOWN_TRIAL, "no such trial on this agent")
        await finish(refusal.code, refusal.message)
        return
    limit = request.max_bytes or DEFAULT_MAX_BYTES
    try:
        real_root, files = await to_thread(plan, root, request.path, request.recursive, limit)
        for f in files:
            fd = await to_thread(open_confined, real_root, f.path)
            try:
                offset = 0
                while True:
                    want = min(CHUNK_SIZE, f.size - offset)  # what `plan` saw: a growing log is cut there
                    data = await to_thread(_read, fd, want) if want > 0 else b""
                    eof = not data or offset + len(data) >= f.size
                    await send(pb.AgentMessage(file_chunk=pb.FileChunk(request_id=rid, path=f.name, offset=offset,
                                                                       data=data, eof=eof)))
                    offset += len(data)
                    if eof:
                        break
            finally:
                os.close(fd)
        await finish()
    except FileRefused as exc:
        await finish(exc.code, exc.message)
    except OSError as exc:
        await finish(pb.FILE_ERROR_IO, f"cannot read the trial's files: {exc.strerror or exc}")
