"""File requests through the hub against scripted agents over real gRPC: an old agent that does
not know FileRequest, an agent that leaves or goes silent mid-answer, and a second agent
that tries to answer a request it was not asked."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.errors import AgentUnavailableError, TrainingServiceError
from nni_manager.hub.files import FILES_MINOR
from tests.support.manager.hubkit import TOKEN, Agent, run, started_hub


async def collect(hub, agent_id: str = "a1", idle: float = 5.0) -> list[pb.FileChunk]:  # type: ignore[no-untyped-def]
    request = pb.FileRequest(trial_id="t1", experiment_id="Exp12345", path="out.txt", max_bytes=1000)
    return [c async for c in hub.fetch_files(agent_id, request, idle)]


def test_old_agent_gets_a_clear_error_not_a_hang(short_dir: Path) -> None:
    async def body() -> None:
        hub, _ = await started_hub(short_dir)
        agent = Agent(hub)
        agent.hello.protocol_minor = FILES_MINOR - 1  # an agent from before FileRequest
        agent.hello.agent_version = "0.0.9"
        await agent.connect()
        with pytest.raises(AgentUnavailableError) as err:
            await asyncio.wait_for(collect(hub), 10)  # raised before anything is sent
        text = str(err.value)
        assert "nni-agent 0.0.9" in text and f"protocol 1.{FILES_MINOR - 1}" in text and "upgrade nni-agent" in text
        assert isinstance(err.value, TrainingServiceError)
        await agent.close()
        await hub.stop()

    run(body())


def test_answer_reassembled_and_not_connected_refused(short_dir: Path) -> None:
    async def body() -> None:
        hub, _ = await started_hub(short_dir)
        with pytest.raises(AgentUnavailableError, match="not connected"):
            await collect(hub)
        agent = Agent(hub)
        await agent.connect()
        fetching = asyncio.create_task(collect(hub))
        request = await agent.read("file_request")
        assert (request.trial_id, request.path, request.max_bytes) == ("t1", "out.txt", 1000)
        rid = request.request_id
        await agent.send(file_chunk=pb.FileChunk(request_id=rid, path="out.txt", offset=0, data=b"hello "))
        await agent.send(file_chunk=pb.FileChunk(request_id=rid, path="out.txt", offset=6, data=b"world", eof=True))
        await agent.send(file_chunk=pb.FileChunk(request_id=rid, last=True))
        chunks = await asyncio.wait_for(fetching, 10)
        assert b"".join(c.data for c in chunks) == b"hello world" and chunks[-1].last
        await agent.close()
        await hub.stop()

    run(body())


def test_agent_leaving_or_silent_mid_answer_fails_the_request(short_dir: Path) -> None:
    async def body() -> None:
        hub, _ = await started_hub(short_dir)
        agent = Agent(hub)
        await agent.connect()
        fetching = asyncio.create_task(collect(hub))
        request = await agent.read("file_request")
        await agent.send(file_chunk=pb.FileChunk(request_id=request.request_id, path="out.txt", data=b"part"))
        await agent.close()  # the stream ends in the middle of the answer
        with pytest.raises(AgentUnavailableError, match="a1"):
            await asyncio.wait_for(fetching, 10)

        agent = Agent(hub, boot_id="boot1")
        await agent.connect()
        fetching = asyncio.create_task(collect(hub, idle=0.3))
        await agent.read("file_request")  # ... and never answered
        with pytest.raises(AgentUnavailableError, match="sent nothing"):
            await asyncio.wait_for(fetching, 10)
        await agent.close()
        await hub.stop()

    run(body())


def test_another_agent_cannot_answer_for_the_one_asked(short_dir: Path) -> None:
    async def body() -> None:
        hub, rec = await started_hub(short_dir)
        rec.store.add_agent("a2", "a2", TOKEN + "2", {})
        hub.register("a2", TOKEN + "2")
        asked, intruder = Agent(hub), Agent(hub, token=TOKEN + "2")
        intruder.hello.agent_id = "a2"
        await asked.connect()
        await intruder.connect()
        fetching = asyncio.create_task(collect(hub))
        request = await asked.read("file_request")
        rid = request.request_id
        await intruder.send(file_chunk=pb.FileChunk(request_id=rid, path="out.txt", data=b"forged", eof=True))
        await intruder.send(file_chunk=pb.FileChunk(request_id=rid, last=True))
        await asked.send(file_chunk=pb.FileChunk(request_id=rid, path="out.txt", data=b"real", eof=True))
        await asked.send(file_chunk=pb.FileChunk(request_id=rid, last=True))
        chunks = await asyncio.wait_for(fetching, 10)
        assert b"".join(c.data for c in chunks) == b"real"
        await asked.close()
        await intruder.close()
        await hub.stop()

    run(body())
