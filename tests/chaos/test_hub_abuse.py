"""The production hub under abuse while a real agent streams a trial through it: random and
mutated protobuf frames, frames before Hello, an oversized frame, and a flood of connections
with bad tokens (some naming the real agent). The hub stays up, the real agent never loses its
session, its trial's metrics arrive exactly once, and no reply or log line carries a secret.

Frames are generated from a printed seed (CHAOS_SEED), by random bytes and by mutating valid
serialised messages (a small property-based fuzzer; Hypothesis is not a dependency here)."""
from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from nni_agent.v1 import PROTOCOL_MAJOR, PROTOCOL_MINOR
from nni_agent.v1 import agent_pb2 as pb
from nni_manager.service import create_training_service
from nni_manager.types import TrialJobMetric, TrialJobStatus
from tests.support.chaos.backend import RelayedBackend
from tests.support.chaos.relay import ChaosRelay
from tests.support.manager.helpers import form, until

CONNECT = "/nni_agent.v1.AgentHub/Connect"


def _frames(rng: random.Random, agent_id: str, count: int) -> list[bytes]:
    """Bad first frames: random bytes, mutated valid messages, wrong tokens, no Hello first."""
    def hello(token: str, who: str = agent_id, major: int = PROTOCOL_MAJOR) -> bytes:
        return pb.AgentMessage(hello=pb.Hello(agent_id=who, token=token, protocol_major=major,
                                              protocol_minor=PROTOCOL_MINOR, boot_id="intruder")).SerializeToString()

    valid = [
        hello("x" * rng.randrange(0, 64)),
        hello(rng.randbytes(16).hex(), who="nobody"),
        hello("guess", major=PROTOCOL_MAJOR + 1),
        pb.AgentMessage(records=pb.RecordBatch(records=[pb.Record(seq=1, metric=pb.Metric(
            trial_id="t", trial_seq=1, data="{}"))])).SerializeToString(),
        pb.AgentMessage(heartbeat=pb.Heartbeat(time_ms=1)).SerializeToString(),
    ]
    out = []
    for _ in range(count):
        kind = rng.randrange(3)
        if kind == 0:
            out.append(rng.randbytes(rng.randrange(1, 200)))
        elif kind == 1:
            frame = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 6)):
                frame[rng.randrange(len(frame))] = rng.randrange(256)
            out.append(bytes(frame))
        else:
            out.append(rng.choice(valid))
    return out


async def _abuse(target: str, frame: bytes) -> tuple[grpc.StatusCode | None, str]:
    """Send one frame as the stream's first message; return how the hub ended the stream (over
    TLS: the hub does not check who dials, only what they say)."""
    credentials = grpc.ssl_channel_credentials(root_certificates=RelayedBackend.ca_certificate)
    async with grpc.aio.secure_channel(target, credentials, options=[("grpc.enable_http_proxy", 0),
                                                                     ("grpc.max_send_message_length", 80 << 20)]) as ch:
        call = ch.stream_stream(CONNECT, request_serializer=lambda b: b,
                                response_deserializer=pb.ManagerMessage.FromString)()
        try:
            await call.write(frame)
            await call.done_writing()
            while (msg := await asyncio.wait_for(call.read(), 10)) is not grpc.aio.EOF:
                if msg.HasField("welcome"):
                    return None, "WELCOMED"
        except grpc.aio.AioRpcError as e:
            return e.code(), e.details() or ""
        return await call.code(), await call.details()


def test_bad_frames_and_token_flood_leave_the_real_agent_alone(
        relayed_platform: None, make_config: Callable, short_dir: Path, chaos_seed: int,
        caplog: pytest.LogCaptureFixture) -> None:
    n = 4000
    rng = random.Random(chaos_seed)

    async def body() -> None:
        relay = ChaosRelay(chaos_seed)  # here only a plain pipe: its connection count shows redials
        RelayedBackend.relay, RelayedBackend.agents, RelayedBackend.work_root = relay, 1, short_dir / "workers"
        heard: list[tuple[str, int]] = []

        def on_metric(m: TrialJobMetric) -> None:
            d = json.loads(m.data)
            heard.append((d["type"], d["sequence"]))

        async with create_training_service(make_config("relayed", reconnect_window=60.0)) as ts:
            ts.add_trial_job_metric_listener(on_metric)
            await until(lambda: ts.agents() and ts.agents()[0]["connected"], 30, "the agent")
            agent_id = ts.agents()[0]["agent_id"]
            token = ts.trials.store.agent_by_name(agent_id)["token"]
            target = relay.target
            job = await ts.submit_trial_job(form(0, n=n, chunk=200, pause=0.05))
            frames = _frames(rng, agent_id, 300)
            replies: Counter[str] = Counter()
            details: set[str] = set()
            for start in range(0, len(frames), 50):  # 50 at a time: a flood, not a fork bomb
                results = await asyncio.gather(*(_abuse(target, f) for f in frames[start:start + 50]))
                for code, detail in results:
                    replies[code.name if code else "WELCOMED"] += 1
                    details.add(detail)
            big = await _abuse(target, b"\x0a" + b"\xff" * 5 + b"\x01" * (65 << 20))  # over the 64 MiB limit
            await until(lambda: ts.trials.get(job.id).status.is_terminal, 60, "the trial")
            detail = await ts.get_trial_job(job.id)
            connected = ts.agents()[0]["connected"]
        await relay.stop()
        print("replies:", dict(replies), "oversized:", big[0])
        # refused in words, never an internal error (nor a traceback logged per bad peer)
        assert set(replies) <= {"INVALID_ARGUMENT", "UNAUTHENTICATED", "FAILED_PRECONDITION"}, replies
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert big[0] == grpc.StatusCode.RESOURCE_EXHAUSTED, big
        assert not any(token in d for d in details), "a reply carried the agent's token"
        assert token not in caplog.text
        assert connected and relay.counts["connections"] == 1, relay.counts  # never had to redial
        assert detail.status == TrialJobStatus.SUCCEEDED, (detail.status, detail.message)
        expected = {("PERIODICAL", i) for i in range(n)} | {("FINAL", 0)}
        assert Counter(heard) == Counter(expected)

    caplog.set_level(logging.DEBUG)
    asyncio.run(body())
