"""The hub against a scripted agent speaking the wire protocol over real gRPC."""
from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from nni_agent.v1 import PROTOCOL_MAJOR
from nni_agent.v1 import agent_pb2 as pb
from nni_manager.bundle import pack
from nni_manager.hub import server
from tests.support.manager.helpers import until
from tests.support.manager.hubkit import Agent, records, run, started_hub, stored_agent


def test_wrong_token_refused_without_echo(short_dir: Path) -> None:
    async def body() -> None:
        hub, _ = await started_hub(short_dir)
        agent = Agent(hub, token="wrong-guess-123")
        await agent.call.write(pb.AgentMessage(hello=agent.hello))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await agent.call.read()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert err.value.details() == "agent a1: invalid token"
        await agent.close()
        await hub.stop()

    run(body())


@pytest.mark.parametrize("major, upgrade", [(PROTOCOL_MAJOR + 1, "upgrade nni-manager"), (0, "upgrade nni-agent")])
def test_protocol_major_mismatch_names_both_versions(short_dir: Path, major: int, upgrade: str) -> None:
    async def body() -> None:
        hub, _ = await started_hub(short_dir)
        agent = Agent(hub, major=major)
        await agent.call.write(pb.AgentMessage(hello=agent.hello))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await agent.call.read()
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = err.value.details()
        assert f"agent speaks protocol {major}." in details
        assert f"this manager speaks {PROTOCOL_MAJOR}." in details and upgrade in details
        await agent.close()
        await hub.stop()

    run(body())


def test_records_deduplicated_acked_and_logs_written(short_dir: Path) -> None:
    async def body() -> None:
        hub, rec = await started_hub(short_dir)
        agent = Agent(hub)
        assert (await agent.connect()).acked_seq == 0
        log1 = pb.LogChunk(trial_id="t1", stream=pb.LOG_STREAM_STDOUT, offset=0, data=b"hello ")
        log2 = pb.LogChunk(trial_id="t1", stream=pb.LOG_STREAM_STDOUT, offset=6, data=b"world\n")
        await agent.send(records=records(
            (1, {"metric": pb.Metric(trial_id="t1", trial_seq=1, data="{}")}), (2, {"log": log1})))
        assert (await agent.read("ack")).seq == 2
        await agent.close()

        agent = Agent(hub)  # same boot reconnects: replay from 3, overlap is dropped
        assert (await agent.connect()).acked_seq == 2
        await agent.send(records=records((2, {"log": log1}), (3, {"log": log2})))
        assert (await agent.read("ack")).seq == 3
        assert [r.seq for r in rec.records] == [1, 2, 3]
        assert (short_dir / "trials" / "t1" / "trial.stdout").read_bytes() == b"hello world\n"
        await agent.send(heartbeat=pb.Heartbeat(time_ms=1))
        assert (await agent.read("ack")).seq == 3  # heartbeats are answered
        await agent.close()

        agent = Agent(hub, boot_id="boot2")  # a restarted agent starts over
        assert (await agent.connect()).acked_seq == 0
        assert rec.events.count(("hello", True)) == 1
        await agent.close()
        await hub.stop()
        assert stored_agent(short_dir, "a1")["boot_id"] == "boot2"

    run(body())


def test_commands_resent_until_acked_and_new_stream_replaces_old(short_dir: Path) -> None:
    async def body() -> None:
        hub, _ = await started_hub(short_dir)
        first = Agent(hub)
        await first.connect()
        hub.send("a1", pb.Command(cancel_trial=pb.CancelTrial(trial_id="t1")))
        hub.send("a1", pb.Command(cancel_trial=pb.CancelTrial(trial_id="t2")))
        cmd = await first.read("command")
        assert (cmd.cmd_seq, cmd.cancel_trial.trial_id) == (1, "t1")
        await first.send(command_ack=pb.CommandAck(cmd_seq=1))
        await until(lambda: len(hub.pending_commands("a1")) == 1, what="ack of command 1")

        second = Agent(hub)  # replaces the first stream; command 2 is sent again
        await second.connect()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            while True:
                await first.call.read()
        assert err.value.code() == grpc.StatusCode.ABORTED
        cmd = await second.read("command")
        assert (cmd.cmd_seq, cmd.cancel_trial.trial_id) == (2, "t2")
        await second.send(command_ack=pb.CommandAck(cmd_seq=2))
        await until(lambda: not hub.pending_commands("a1"), what="ack of command 2")
        assert stored_agent(short_dir, "a1")["next_cmd_seq"] == 3
        await first.close()
        await second.close()
        await hub.stop()

    run(body())


def _metric(seq: int) -> tuple[int, dict[str, pb.Metric]]:
    return seq, {"metric": pb.Metric(trial_id="t1", trial_seq=seq, data="{}")}


def test_acks_ride_on_commands_to_a_new_agent_and_come_bare_when_none_goes(
        short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> None:
        hub, rec = await started_hub(short_dir)
        agent = Agent(hub)  # protocol 1.4: reads ManagerMessage.acked
        await agent.connect()
        monkeypatch.setattr(server, "_ACK_DELAY", 60.0)  # no bare Ack in this part: a riding one or none
        await agent.send(records=records(_metric(1), _metric(2)))
        await until(lambda: len(rec.records) == 2, what="records stored")
        hub.send("a1", pb.Command(cancel_trial=pb.CancelTrial(trial_id="t1")))
        msg = await agent.next()
        assert (msg.WhichOneof("body"), msg.command.cmd_seq, msg.acked) == ("command", 1, 2), msg
        hub.send("a1", pb.Command(cancel_trial=pb.CancelTrial(trial_id="t2")))
        msg = await agent.next()
        assert (msg.WhichOneof("body"), msg.acked) == ("command", 0), msg  # nothing new to acknowledge
        monkeypatch.setattr(server, "_ACK_DELAY", 0.05)  # no command goes from here: a bare Ack after the delay
        await agent.send(records=records(_metric(3)), command_acked=2)  # the agent's ack rides too
        await until(lambda: not hub.pending_commands("a1"), what="commands acknowledged by a record frame")
        msg = await agent.next()
        assert (msg.WhichOneof("body"), msg.ack.seq) == ("ack", 3), msg
        await agent.close()
        await hub.stop()

    run(body())


def test_a_trials_end_is_acknowledged_at_once(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-trial agent (a job platform's) exits once its trial's end is stored: that Ack never waits."""
    monkeypatch.setattr(server, "_ACK_DELAY", 60.0)

    async def body() -> None:
        hub, _ = await started_hub(short_dir)
        agent = Agent(hub)
        await agent.connect()
        await agent.send(records=records(_metric(1)))  # owed, not sent: a message may still come to ride on
        end = pb.TrialStatus(trial_id="t1", state=pb.TRIAL_STATE_SUCCEEDED, has_exit_code=True)
        await agent.send(records=records((2, {"status": end})))
        msg = await agent.next()
        assert (msg.WhichOneof("body"), msg.ack.seq) == ("ack", 2), msg
        await agent.close()
        await hub.stop()

    run(body())


def test_an_older_agent_gets_a_bare_ack_for_every_batch_at_once(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "_ACK_DELAY", 60.0)  # what a newer agent would wait for a command to ride on

    async def body() -> None:
        hub, _ = await started_hub(short_dir)
        agent = Agent(hub, minor=3)  # from before riding acks: it would never read one
        await agent.connect()
        for seq in (1, 2):
            await agent.send(records=records(_metric(seq)))
            msg = await agent.next()
            assert (msg.WhichOneof("body"), msg.ack.seq) == ("ack", seq), msg
        hub.send("a1", pb.Command(cancel_trial=pb.CancelTrial(trial_id="t1")))
        msg = await agent.next()
        assert msg.WhichOneof("body") == "command" and msg.acked == 0, msg
        await agent.close()
        await hub.stop()

    run(body())


def test_reconnect_window(short_dir: Path) -> None:
    async def body() -> None:
        hub, rec = await started_hub(short_dir, reconnect_window=0.3)
        agent = Agent(hub)
        await agent.connect()
        assert hub.connected("a1")
        await agent.close()
        await until(lambda: ("lost", "a1") in rec.events, what="lost")
        assert not hub.connected("a1")
        await until(lambda: ("expired", "a1") in rec.events, what="expired")
        agent = Agent(hub)  # it may still come back later
        await agent.connect()
        assert hub.connected("a1")
        await agent.close()
        await hub.stop()

    run(body())


def test_bundle_served_in_chunks(short_dir: Path) -> None:
    async def body() -> None:
        code = short_dir / "code"
        code.mkdir()
        (code / "rand.bin").write_bytes(os.urandom(3 * 1024 * 1024))  # incompressible: several chunks
        b = pack(code, short_dir / "bundles")
        hub, _ = await started_hub(short_dir)
        agent = Agent(hub)
        await agent.connect()
        await agent.send(bundle_request=pb.BundleRequest(digest=b.digest))
        data = b""
        while True:
            chunk = await agent.read("bundle_chunk")
            assert chunk.offset == len(data) and not chunk.error
            data += chunk.data
            if chunk.last:
                break
        assert data == b.path.read_bytes()
        await agent.send(bundle_request=pb.BundleRequest(digest="sha256:" + "0" * 64))
        chunk = await agent.read("bundle_chunk")
        assert chunk.last and "no bundle" in chunk.error
        await agent.close()
        await hub.stop()

    run(body())


def test_silent_stream_counts_as_lost_and_is_ended(short_dir: Path) -> None:
    async def body() -> None:
        hub, rec = await started_hub(short_dir, reconnect_window=0.3, heartbeat_interval=0.05)
        agent = Agent(hub)
        await agent.connect()
        await until(lambda: ("lost", "a1") in rec.events, what="silence noticed")
        await until(lambda: ("expired", "a1") in rec.events, what="expiry")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            while True:
                await agent.call.read()
        assert err.value.code() == grpc.StatusCode.ABORTED and "silent" in err.value.details()
        await agent.close()
        await hub.stop()

    run(body())
