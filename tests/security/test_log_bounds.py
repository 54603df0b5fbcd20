"""Log chunks from an agent are bounded, and so is what the manager serves of a log.

An agent (its own trial, real gRPC) cannot write at any offset: a chunk 5 TB into the file or
past its end is refused (no sparse multi-terabyte file), and no streamed log grows past the
manager's cap. A large log is served by the WebUI only up to its cap (its tail, after a note),
and `get_trial_file` from the manager's copy answers TrialFileTooLargeError past `max_bytes`.
"""
from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.errors import TrialFileTooLargeError
from nni_manager.hub import logfiles
from tests.support.manager.helpers import until
from tests.support.security.agentkit import fleet, get, stored_webui

MiB = 1 << 20
SERVE_LIMIT = 16 * MiB  # the most of one log the WebUI serves at once (nni_manager.local_files)


def _chunk(trial_id: str, offset: int, data: bytes) -> dict[str, pb.LogChunk]:
    return {"log": pb.LogChunk(trial_id=trial_id, stream=pb.LOG_STREAM_STDOUT, offset=offset, data=data)}


def test_a_chunk_far_past_the_end_is_refused(short_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)

    async def body() -> None:
        async with fleet(short_dir) as f:
            own = await f.submit()
            assert (await f.evil.started()).trial_id == own.id
            copy = f.experiment_dir / "trials" / own.id / "trial.stdout"
            await f.evil.send(_chunk(own.id, 0, b"line one\n"), _chunk(own.id, 5 << 40, b"far away\n"),
                              _chunk(own.id, 9, b"line two\n"), _chunk(own.id, 100, b"after a gap\n"),
                              _chunk(own.id, 0, b"line one\n"))  # a replayed chunk rewrites its bytes
            assert copy.stat().st_size == 18  # before reading it: on failure it is 5 TB
            assert copy.read_bytes() == b"line one\nline two\n"
            assert f.evil.acked == f.evil.seq  # refused, not a storage failure: the stream goes on
            assert any("gap" in r.getMessage() and own.id in r.getMessage() for r in caplog.records)

    asyncio.run(body())


def test_a_streamed_log_stops_at_the_cap(short_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(logfiles, "MAX_LOG_BYTES", 64 << 10, raising=False)  # the hub runs in this process

    async def body() -> None:
        async with fleet(short_dir) as f:
            own = await f.submit()
            assert (await f.evil.started()).trial_id == own.id
            piece = b"x" * (24 << 10)
            await f.evil.send(*(_chunk(own.id, i * len(piece), piece) for i in range(4)))
            copy = f.experiment_dir / "trials" / own.id / "trial.stdout"
            assert copy.stat().st_size == 64 << 10
            assert any(str(64 << 10) in r.getMessage() for r in caplog.records)

    asyncio.run(body())


def test_what_is_served_of_a_large_log_is_capped(short_dir: Path) -> None:
    size = SERVE_LIMIT + 4 * MiB

    async def body() -> tuple[Path, str]:
        async with fleet(short_dir) as f:
            own = await f.submit()
            assert (await f.evil.started()).trial_id == own.id
            await f.evil.send({"status": pb.TrialStatus(trial_id=own.id, state=pb.TRIAL_STATE_RUNNING,
                                                        start_time_ms=1)})
            block = b"y" * (MiB - 4)
            for i in range(size // MiB):  # each MiB its own block: what is served can be checked
                await f.evil.send(_chunk(own.id, i * MiB, block + b"%03d\n" % i))
            copy = f.experiment_dir / "trials" / own.id / "trial.stdout"
            assert os.path.getsize(copy) == size
            await f.evil.__aexit__()  # gone: files come from the manager's copy
            await until(lambda: not f.ts.core.agent_connected("evil"), 30, "evil to be gone")
            with pytest.raises(TrialFileTooLargeError):
                await f.ts.get_trial_file(own.id, "stdout", max_bytes=MiB)
            return f.experiment_dir, own.id

    experiment_dir, own = asyncio.run(body())

    async def view() -> None:
        async with stored_webui(experiment_dir) as api:
            status, text = await get(f"{api}/trial-file/{own}/stdout")
            assert status == 200
            assert SERVE_LIMIT <= len(text) < SERVE_LIMIT + 200, len(text)
            assert text.startswith(b"[first ") and text.endswith(b"%03d\n" % (size // MiB - 1))

    asyncio.run(view())
