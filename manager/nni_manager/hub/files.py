"""File requests in flight between the hub and agents (a trial's files, fetched over the stream).

Unlike commands, a FileRequest is not replayed after a reconnect: it is a question asked of
one live session. If that session ends, or the agent stays silent for `idle_timeout`, the
request fails at once with AgentUnavailableError instead of waiting forever.
"""
from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable

from nni_agent.compat import wait_for
from nni_agent.v1 import agent_pb2 as pb
from nni_manager.errors import AgentUnavailableError
from nni_manager.version import __version__

# The first protocol minor whose agents answer FileRequest (older ones ignore it).
FILES_MINOR = 2


class FileFetches:
    """Pending requests: request id -> (agent id, the session asked, the queue its chunks arrive in)."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[str, object, asyncio.Queue[pb.FileChunk | str]]] = {}

    def deliver(self, agent_id: str, chunk: pb.FileChunk) -> None:
        """A chunk from `agent_id`; dropped when nobody waits for it (any more), and when another
        agent asked it: an agent answers only its own requests."""
        entry = self._pending.get(chunk.request_id)
        if entry is not None and entry[0] == agent_id:
            entry[2].put_nowait(chunk)

    def session_ended(self, session: object, why: str) -> None:
        """Fail every request asked of that session (the agent answers on no other)."""
        for _, asked, queue in self._pending.values():
            if asked is session:
                queue.put_nowait(why)

    async def fetch(self, agent_id: str, session: object, post: Callable[[pb.ManagerMessage], None],
                    request: pb.FileRequest, idle_timeout: float) -> AsyncIterator[pb.FileChunk]:
        """Send `request` with `post` (on `session`) and yield its chunks up to (and with) the
        `last` one. Memory is bounded by the request's max_bytes: the agent checks sizes first."""
        rid = next(self._ids)
        queue: asyncio.Queue[pb.FileChunk | str] = asyncio.Queue()
        self._pending[rid] = (agent_id, session, queue)
        request.request_id = rid
        try:
            post(pb.ManagerMessage(file_request=request))
            while True:
                try:
                    item = await wait_for(queue.get(), idle_timeout)
                except asyncio.TimeoutError:
                    raise AgentUnavailableError(
                        f"agent {agent_id} sent nothing for {idle_timeout:g} s while answering a file request"
                    ) from None
                if isinstance(item, str):
                    raise AgentUnavailableError(f"agent {agent_id}: {item}")
                yield item
                if item.last:
                    return
        finally:
            del self._pending[rid]


def too_old(agent_id: str, version: str, minor: int) -> str:
    """Why an agent that predates FileRequest cannot serve one, and the fix."""
    return (f"agent {agent_id} runs nni-agent {version or '(unknown version)'} (protocol 1.{minor}), which cannot "
            f"send trial files (needs protocol 1.{FILES_MINOR}): upgrade nni-agent on that worker to "
            f"{__version__}")
