"""The agent's trial-file server: confined to the trial directory, chunked, size-bounded."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from nni_agent import files
from nni_agent.v1 import agent_pb2 as pb


@pytest.fixture
def trial_dir(tmp_path: Path) -> Path:
    d = tmp_path / "trial"
    (d / "output" / "deep").mkdir(parents=True)
    (d / "trial.log").write_text("sdk log\n")
    (d / "output" / "model.bin").write_bytes(bytes(range(256)) * 4000)  # 1,024,000 bytes: several chunks
    (d / "output" / "deep" / "empty").write_bytes(b"")
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the manager")
    (d / "escape").symlink_to(secret)  # a file symlink pointing out
    (d / "output" / "outdir").symlink_to(tmp_path)  # a directory symlink pointing out
    return d


def answer(request: pb.FileRequest, root: Path | None) -> list[pb.FileChunk]:
    sent: list[pb.FileChunk] = []

    async def send(msg: pb.AgentMessage) -> None:
        sent.append(msg.file_chunk)

    asyncio.run(files.serve(request, root, send))
    return sent


def reassemble(chunks: list[pb.FileChunk]) -> dict[str, bytes]:
    out: dict[str, bytearray] = {}
    for c in chunks:
        if c.path:
            buf = out.setdefault(c.path, bytearray())
            buf[c.offset:c.offset + len(c.data)] = c.data
    return {k: bytes(v) for k, v in out.items()}


def test_one_file_in_bounded_chunks(trial_dir: Path) -> None:
    chunks = answer(pb.FileRequest(request_id=7, path="output/model.bin"), trial_dir)
    assert all(c.request_id == 7 for c in chunks)
    assert chunks[-1].last and chunks[-1].error == pb.FILE_ERROR_NONE
    data = [c for c in chunks if c.path]
    assert len(data) >= 4 and all(len(c.data) <= files.CHUNK_SIZE for c in data)
    assert [c.eof for c in data] == [False] * (len(data) - 1) + [True]
    assert reassemble(chunks) == {"output/model.bin": (trial_dir / "output" / "model.bin").read_bytes()}


def test_directory_skips_symlinks_and_keeps_empty_files(trial_dir: Path) -> None:
    chunks = answer(pb.FileRequest(request_id=1, path="", recursive=True), trial_dir)
    got = reassemble(chunks)
    assert set(got) == {"trial.log", "output/model.bin", "output/deep/empty"}
    assert got["output/deep/empty"] == b"" and got["trial.log"] == b"sdk log\n"
    sub = reassemble(answer(pb.FileRequest(request_id=2, path="output", recursive=True), trial_dir))
    assert set(sub) == {"model.bin", "deep/empty"}  # relative to the directory asked for


@pytest.mark.parametrize("name, code", [
    ("../secret.txt", pb.FILE_ERROR_NOT_ALLOWED),
    ("output/../../secret.txt", pb.FILE_ERROR_NOT_ALLOWED),
    ("/etc/passwd", pb.FILE_ERROR_NOT_ALLOWED),
    ("escape", pb.FILE_ERROR_NOT_ALLOWED),  # symlink to a file outside
    ("output/outdir/secret.txt", pb.FILE_ERROR_NOT_ALLOWED),  # through a directory symlink
    ("missing.txt", pb.FILE_ERROR_NOT_FOUND),
    ("output", pb.FILE_ERROR_NOT_FOUND),  # a directory, asked as one file
])
def test_refusals(trial_dir: Path, name: str, code: int) -> None:
    chunks = answer(pb.FileRequest(request_id=3, path=name), trial_dir)
    assert len(chunks) == 1 and chunks[0].last and chunks[0].error == code and chunks[0].message
    assert b"not for the manager" not in b"".join(c.data for c in chunks)


def test_over_the_limit_refused_before_sending(trial_dir: Path) -> None:
    chunks = answer(pb.FileRequest(request_id=4, path="output/model.bin", max_bytes=1000), trial_dir)
    assert len(chunks) == 1 and chunks[0].error == pb.FILE_ERROR_TOO_LARGE
    assert "1024000 bytes" in chunks[0].message and "1000" in chunks[0].message
    chunks = answer(pb.FileRequest(request_id=5, path="", recursive=True, max_bytes=2000), trial_dir)
    assert len(chunks) == 1 and chunks[0].error == pb.FILE_ERROR_TOO_LARGE


def test_unknown_trial(tmp_path: Path) -> None:
    chunks = answer(pb.FileRequest(request_id=6, path="trial.log"), tmp_path / "gone")
    assert chunks[0].error == pb.FILE_ERROR_UNKNOWN_TRIAL


def test_parent_swapped_for_a_symlink_after_the_check(trial_dir: Path, tmp_path: Path) -> None:
    """The race a trial could try: `plan` saw a real directory, then it became a symlink."""
    real_root, planned = files.plan(trial_dir, "output/model.bin", False, 1 << 30)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.bin").write_bytes(b"outside data")
    os.rename(trial_dir / "output", trial_dir / "output.old")
    (trial_dir / "output").symlink_to(outside)
    with pytest.raises(files.FileRefused) as err:
        fd = files.open_confined(real_root, planned[0].path)
        os.close(fd)
    assert err.value.code == pb.FILE_ERROR_NOT_ALLOWED
