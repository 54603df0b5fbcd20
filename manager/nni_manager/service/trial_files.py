"""A trial's files from wherever it ran: NNI's getTrialFile and fetchTrialOutput.

The files live on the trial's agent (this machine, an SSH host, a pod), so they are asked of
the agent over its stream (hub/files.py, agent side nni_agent/files.py): one code path for
every platform. The manager's own copies (trial.stdout, trial.stderr and trial.log, streamed
as the trial runs) answer when the agent is gone.
"""
from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.errors import (
    AgentUnavailableError,
    TrainingServiceError,
    TrialFileNotAllowedError,
    TrialFileNotFoundError,
    TrialFileTooLargeError,
    TrialNotFoundError,
)
from nni_manager.local_files import open_in, read_capped
from nni_manager.service.ports import TrialFilesCore
from nni_manager.types import TrialJobDetail

log = logging.getLogger(__name__)

# NNI's names for the standard streams (its local trials wrote `stdout` / `stderr`).
NNI_NAMES = {"stdout": "trial.stdout", "stderr": "trial.stderr"}
FILE_LIMIT = 64 << 20  # get_trial_file holds the whole file in memory
DIRECTORY_LIMIT = 1 << 30  # download_trial_directory writes to disk as it goes
IDLE_TIMEOUT = 30.0  # an agent silent this long in the middle of an answer is taken as gone


def _relative(name: str, what: str = "file name") -> PurePosixPath:
    """`name` as a path inside a directory, or TrialFileNotAllowedError."""
    rel = PurePosixPath(name)
    if not name or "\x00" in name or "\\" in name or rel.is_absolute() or ".." in rel.parts:
        raise TrialFileNotAllowedError(f"{what} {name!r} is not a path inside the trial directory: give a relative "
                                       "path without '..', e.g. 'trial.log' or 'output/model.pt'")
    return rel


def nni_decoded(name: str, data: bytes) -> str | bytes:
    """NNI's getTrialFile answer: text for names without an extension or ending .log / .txt,
    bytes otherwise (localTrainingService.ts)."""
    base = PurePosixPath(name).name
    if "." not in base or base.endswith((".log", ".txt", ".stdout", ".stderr")):
        return data.decode("utf-8", "replace")
    return data


class TrialFiles:
    """get / download a trial's files through its agent."""

    def __init__(self, core: TrialFilesCore) -> None:
        self.core = core

    # ------------------------------------------------------------------ API
    async def get_trial_file(self, trial_id: str, name: str, max_bytes: int = FILE_LIMIT) -> str | bytes:
        return nni_decoded(NNI_NAMES.get(name, name), await self.read(trial_id, name, max_bytes))

    async def read(self, trial_id: str, name: str, max_bytes: int = FILE_LIMIT) -> bytes:
        """The bytes of `name` in the trial's directory (first agent of a multi-agent trial)."""
        t = self._trial(trial_id)
        wanted = NNI_NAMES.get(name, name)
        rel = _relative(wanted)
        if not t.agents:
            copy = self._own_copy(t, rel, max_bytes)
            if copy is not None:
                return copy
            raise TrialFileNotFoundError(f"trial {t.id} has not started on any agent yet ({t.status.value}): "
                                         "it has no files")
        agent_id = t.agents[0]
        data = bytearray()
        try:
            async for chunk in self._fetch(t, agent_id, rel.as_posix(), False, max_bytes):
                if chunk.data:
                    data[chunk.offset:chunk.offset + len(chunk.data)] = chunk.data
        except (AgentUnavailableError, TrialFileNotFoundError) as exc:
            copy = self._own_copy(t, rel, max_bytes)
            if copy is not None:  # the manager's own copy of a streamed log
                log.debug("trial %s: %s from the manager's copy (%s)", t.id, wanted, exc)
                return copy
            raise
        return bytes(data)

    async def download(self, trial_id: str, dest: str | os.PathLike[str], subpath: str = "",
                       max_bytes: int = DIRECTORY_LIMIT) -> list[Path]:
        """Copy the trial's directory (or `subpath` of it) into `dest`; returns the files written."""
        t = self._trial(trial_id)
        rel = _relative(subpath, "subpath").as_posix() if subpath else ""
        if not t.agents:
            raise TrialFileNotFoundError(f"trial {t.id} has not started on any agent yet ({t.status.value}): "
                                         "it has no directory")
        root = Path(dest)
        root.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        open_files: dict[str, BinaryIO] = {}
        try:
            async for chunk in self._fetch(t, t.agents[0], rel, True, max_bytes):
                if chunk.last and not chunk.path:
                    break
                f = open_files.get(chunk.path)
                if f is None:
                    target = root.joinpath(*_relative(chunk.path, "path from the agent").parts)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    f = open_files[chunk.path] = open(target, "wb")
                    written.append(target)
                f.seek(chunk.offset)
                f.write(chunk.data)
                if chunk.eof:
                    open_files.pop(chunk.path).close()
        finally:
            for f in open_files.values():
                f.close()
        return written

    # ------------------------------------------------------------------ plumbing
    def _own_copy(self, t: TrialJobDetail, rel: PurePosixPath, max_bytes: int) -> bytes | None:
        """The manager's streamed copy of a log (no symlink followed), bounded as the agent
        bounds its answers; None when there is none."""
        own = self.core.experiment_dir / "trials" / t.id
        f = open_in(own, own.joinpath(*rel.parts).parent, rel.name)
        if f is None:
            return None
        data = read_capped(f, max_bytes, tail=False)
        if data is None:
            raise TrialFileTooLargeError(f"trial {t.id}: the manager's copy of {rel} is larger than {max_bytes} "
                                         "bytes (max_bytes)")
        return data

    def _trial(self, trial_id: str) -> TrialJobDetail:
        t = self.core.trials.by_id.get(trial_id)
        if t is None:
            raise TrialNotFoundError(f"no trial {trial_id!r} in experiment {self.core.experiment_id}")
        return t

    async def _fetch(self, t: TrialJobDetail, agent_id: str, path: str, recursive: bool,
                     max_bytes: int) -> AsyncIterator[pb.FileChunk]:
        """The agent's chunks for one request; its refusal as the matching error."""
        core = self.core
        request = pb.FileRequest(trial_id=t.id, experiment_id=core.experiment_id, path=path, recursive=recursive,
                                 max_bytes=max_bytes)
        name = core.agents.name(agent_id)
        async for chunk in core.hub.fetch_files(agent_id, request, IDLE_TIMEOUT):
            if chunk.last and chunk.error:
                raise _refusal(t.id, name, chunk)
            yield chunk


def _refusal(trial_id: str, agent: str, chunk: pb.FileChunk) -> TrainingServiceError:
    text = f"trial {trial_id} on agent {agent}: {chunk.message}"
    if chunk.error in (pb.FILE_ERROR_NOT_FOUND, pb.FILE_ERROR_UNKNOWN_TRIAL):
        return TrialFileNotFoundError(text)
    if chunk.error == pb.FILE_ERROR_NOT_ALLOWED:
        return TrialFileNotAllowedError(text)
    if chunk.error == pb.FILE_ERROR_TOO_LARGE:
        return TrialFileTooLargeError(text)
    return TrainingServiceError(text)
