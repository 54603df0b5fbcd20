"""Content-addressed cache of trial code bundles shipped over the agent channel.

A bundle is a tar.gz named by its sha256 digest. It crosses the link once per worker:
the unpacked copy under `<root>/<hex>/` is reused by every later trial and agent run.

Chunks are written and hashed on the event loop as they arrive (about 1 ms per 1 MiB chunk),
in order; the unpacking (most of a second for a few hundred MB) runs in a worker thread,
so heartbeats, records and the other trials go on meanwhile. A bundle being unpacked is
neither re-requested after a reconnect nor touched by stray chunks.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    import hashlib

from nni_agent.compat import to_thread
from nni_agent.v1 import agent_pb2 as pb


class BundleError(RuntimeError):
    """A bundle could not be fetched or unpacked; the reason says why."""


def _hex(digest: str) -> str:
    algo, _, hexdigest = digest.partition(":")
    if algo != "sha256" or len(hexdigest) != 64 or not all(c in "0123456789abcdef" for c in hexdigest):
        raise BundleError(f"malformed bundle digest {digest!r}: expected 'sha256:<64 hex digits>'")
    return hexdigest


class BundleCache:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._waiters: dict[str, asyncio.Future[Path]] = {}
        self._parts: dict[str, tuple[hashlib._Hash, BinaryIO]] = {}  # digest -> (sha256 so far, open .part file)
        self._unpacking: dict[str, asyncio.Task[None]] = {}  # digest -> its unpack, all chunks in

    def path_for(self, digest: str) -> Path | None:
        """The unpacked directory if this bundle is already cached."""
        path = self.root / _hex(digest)
        return path if path.is_dir() else None

    async def get(self, digest: str, request: Callable[[str], None]) -> Path:
        """Return the unpacked bundle, asking the manager for it (once) if needed."""
        cached = self.path_for(digest)
        if cached is not None:
            return cached
        fut = self._waiters.get(digest)
        if fut is None:
            fut = self._waiters[digest] = asyncio.get_running_loop().create_future()
            request(digest)
        return await asyncio.shield(fut)

    def pending(self) -> list[str]:
        """Digests still awaited: re-requested from scratch after a reconnect (not one being
        unpacked: it is all here)."""
        for digest in list(self._parts):
            self._drop_part(digest)
        return [d for d, f in self._waiters.items() if not f.done() and d not in self._unpacking]

    def on_chunk(self, chunk: pb.BundleChunk) -> None:
        digest = chunk.digest
        fut = self._waiters.get(digest)
        if fut is None or fut.done() or digest in self._unpacking:
            return  # not asked for (or already failed), or all in already: ignore
        try:
            if chunk.error:
                raise BundleError(f"manager could not send bundle {digest}: {chunk.error}")
            hexdigest = _hex(digest)
            self.root.mkdir(parents=True, exist_ok=True)
            part = self.root / f"{hexdigest}.tar.gz.part"
            if chunk.offset == 0:
                import hashlib  # only workers that receive code pay for it

                self._drop_part(digest)
                self._parts[digest] = (hashlib.sha256(), open(part, "wb"))
            state = self._parts.get(digest)
            if state is None:
                return  # a chunk from a transfer cut before we restarted it
            hasher, fh = state
            if fh.tell() != chunk.offset:
                raise BundleError(f"bundle {digest}: chunk at offset {chunk.offset}, expected {fh.tell()}")
            fh.write(chunk.data)
            hasher.update(chunk.data)
            if chunk.last:
                fh.close()
                del self._parts[digest]
                if hasher.hexdigest() != hexdigest:
                    part.unlink(missing_ok=True)
                    raise BundleError(f"bundle {digest} arrived corrupted (digest mismatch)")
                self._unpacking[digest] = asyncio.get_running_loop().create_task(
                    self._unpack_for(digest, part, hexdigest, fut), name=f"unpack-{hexdigest[:12]}")
        except Exception as exc:  # a broken transfer fails its trials, never the agent
            self._drop_part(digest)
            fut.set_exception(exc if isinstance(exc, BundleError) else BundleError(f"bundle {digest}: {exc}"))
        finally:
            if fut.done():
                self._waiters.pop(digest, None)

    async def _unpack_for(self, digest: str, archive: Path, hexdigest: str, fut: asyncio.Future[Path]) -> None:
        """Unpack in a worker thread, then resolve the waiters (with the error if it fails)."""
        try:
            path = await to_thread(self._unpack, archive, hexdigest)
        except Exception as exc:  # a bad archive fails its trials, never the agent
            if not fut.done():
                fut.set_exception(BundleError(f"bundle {digest}: {exc}"))
        else:
            if not fut.done():
                fut.set_result(path)
        finally:
            del self._unpacking[digest]
            if fut.done():
                self._waiters.pop(digest, None)

    def _unpack(self, archive: Path, hexdigest: str) -> Path:
        """Extract next to the cache and rename into place: a half-unpacked bundle is never used.
        Runs in a worker thread; leaves neither the archive nor a partial directory behind."""
        import shutil
        import tarfile  # only workers that receive code pay for it

        from nni_agent.safe_tar import extract_all

        final = self.root / hexdigest
        tmp = self.root / f"{hexdigest}.unpacking"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            with tarfile.open(archive) as tar:
                extract_all(tar, tmp)  # refuses absolute paths, .., links out, device files
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            archive.unlink(missing_ok=True)
        return final

    def _drop_part(self, digest: str) -> None:
        state = self._parts.pop(digest, None)
        if state is not None:
            state[1].close()
