"""A code bundle is unpacked off the agent's event loop: heartbeats and records go on meanwhile,
the result is the same, and a broken bundle fails only the trials waiting for it."""
from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import os
import tarfile
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from nni_agent.bundles import BundleCache, BundleError
from nni_agent.v1 import agent_pb2 as pb
from tests.support.bounded import run_bounded

CHUNK = 64 << 10


def _tarball(files: dict[str, bytes], *, extra: tarfile.TarInfo | None = None) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=1, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if extra is not None:
            tar.addfile(extra, io.BytesIO(b"x" * extra.size))
    return buf.getvalue()


def _many_files(n: int = 2000) -> dict[str, bytes]:
    """A code directory of many small files (tarfile's cost is per member: this takes a while)."""
    return {f"pkg/m{i // 100}/f{i}.py": os.urandom(256) for i in range(n)}


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _chunks(digest: str, data: bytes) -> Iterator[pb.BundleChunk]:
    for off in range(0, len(data), CHUNK):
        yield pb.BundleChunk(digest=digest, offset=off, data=data[off:off + CHUNK], last=off + CHUNK >= len(data))


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    return run_bounded(coro, 120)


async def _receive(cache: BundleCache, digest: str, data: bytes) -> None:
    """Hand the chunks over the way the receive loop does: one per loop step."""
    for chunk in _chunks(digest, data):
        cache.on_chunk(chunk)
        await asyncio.sleep(0)


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.is_dir() or p.name.endswith(".unpacking"))


def test_unpacking_leaves_the_loop_free_and_the_result_complete(tmp_path: Path) -> None:
    files = _many_files()
    data = _tarball(files)
    digest = _digest(data)
    cache = BundleCache(tmp_path / "bundles")

    async def body() -> tuple[Path, float, float, int]:
        requested: list[str] = []
        getter = asyncio.create_task(cache.get(digest, requested.append))
        await asyncio.sleep(0)
        assert requested == [digest]
        stamps: list[float] = []

        async def ticker() -> None:  # what the heartbeats and the send loop would see
            while True:
                stamps.append(time.perf_counter())
                await asyncio.sleep(0.001)

        ticking = asyncio.create_task(ticker())
        *body_chunks, last = _chunks(digest, data)
        for chunk in body_chunks:
            cache.on_chunk(chunk)
            await asyncio.sleep(0)
        begin = time.perf_counter()
        cache.on_chunk(last)  # all in: the unpack starts
        assert cache.pending() == []  # a reconnect now must not ask for it again ...
        cache.on_chunk(pb.BundleChunk(digest=digest, offset=0, data=data[:CHUNK]))  # ... nor restart it
        path = await getter
        end = time.perf_counter()
        ticking.cancel()
        window = [begin, *(s for s in stamps if begin < s < end), end]
        worst = max(b - a for a, b in zip(window, window[1:]))
        return path, end - begin, worst, len(window) - 2

    path, unpack_s, worst_gap_s, ticks = _run(body())
    assert ticks > 0 and worst_gap_s < unpack_s / 2, (
        f"the loop stalled {worst_gap_s * 1000:.1f} ms of a {unpack_s * 1000:.1f} ms unpack ({ticks} ticks)")
    assert path == tmp_path / "bundles" / digest.split(":")[1] and cache.path_for(digest) == path
    unpacked = {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert unpacked == files
    assert _leftovers(tmp_path / "bundles") == []  # no .part, archive or half-unpacked directory
    assert cache.pending() == []


@pytest.mark.parametrize("broken", ["digest mismatch", "not an archive", "path escapes the bundle"])
def test_a_broken_bundle_fails_only_its_waiters_and_leaves_nothing_behind(tmp_path: Path, broken: str) -> None:
    good = _tarball({"train.py": b"print('ok')\n"})
    if broken == "digest mismatch":
        bad = _tarball({"train.py": b"print('bad')\n"})
        bad_digest, bad = _digest(bad), bad[:-10] + b"corrupted!"
    elif broken == "not an archive":
        bad = os.urandom(3 * CHUNK + 5)
        bad_digest = _digest(bad)
    else:  # refused by tarfile's "data" filter, in the worker thread
        escape = tarfile.TarInfo("../escaped.py")
        escape.size = 3
        bad = _tarball({"train.py": b"1\n"}, extra=escape)
        bad_digest = _digest(bad)
    good_digest = _digest(good)
    cache = BundleCache(tmp_path / "bundles")

    async def body() -> None:
        requested: list[str] = []
        waiters = [asyncio.create_task(cache.get(d, requested.append)) for d in (bad_digest, bad_digest, good_digest)]
        await asyncio.sleep(0)
        assert requested == [bad_digest, good_digest]  # asked once per bundle
        await asyncio.gather(_receive(cache, bad_digest, bad), _receive(cache, good_digest, good))
        outcomes = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(o, BundleError) for o in outcomes[:2]), outcomes
        assert bad_digest in str(outcomes[0])
        assert outcomes[2] == tmp_path / "bundles" / good_digest.split(":")[1]
        assert (outcomes[2] / "train.py").read_bytes() == b"print('ok')\n"
        assert cache.pending() == [] and cache.path_for(bad_digest) is None
        retry = asyncio.create_task(cache.get(bad_digest, requested.append))  # a later trial asks again
        await asyncio.sleep(0)
        assert requested[-1] == bad_digest and cache.pending() == [bad_digest]
        retry.cancel()

    _run(body())
    assert _leftovers(tmp_path / "bundles") == []
    assert not (tmp_path / "escaped.py").exists()
