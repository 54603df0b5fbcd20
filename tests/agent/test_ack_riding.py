"""A command's ack rides on the agent's next message (its RUNNING status, or a telemetry report) for a manager of protocol 1.4 (one stream
write less per command) and is a bare CommandAck for an older manager, which would not read it there."""
from __future__ import annotations

from pathlib import Path

from nni_agent.v1 import agent_pb2 as pb
from tests.support.agent.hubstub import HubStub, StubServer, start_trial
from tests.support.bounded import run_bounded


def _run_one_trial(tmp_path: Path, hub: HubStub) -> None:
    async def scenario() -> None:
        async with StubServer(hub) as srv:
            await srv.connect_agent(tmp_path / "w")
            hub.send(**start_trial("ride01", "echo out"))
            await hub.wait_for(lambda: hub.trials["ride01"].final is not None and not hub._unacked, 60)
        assert hub.trials["ride01"].final.state == pb.TRIAL_STATE_SUCCEEDED

    run_bounded(scenario(), 120)


def test_a_new_manager_gets_the_command_ack_on_the_running_status(tmp_path: Path) -> None:
    hub = HubStub(protocol_minor=4)
    _run_one_trial(tmp_path, hub)
    kinds = [m.WhichOneof("body") for m in hub.received]
    assert "command_ack" not in kinds, kinds
    carriers = [m for m in hub.received if m.command_acked]  # the RUNNING frame, or a telemetry report
    assert [m.command_acked for m in carriers] == [1], hub.received
    running = next(i for i, m in enumerate(hub.received) if m.WhichOneof("body") == "records")
    assert hub.received.index(carriers[0]) <= running  # no later than the trial's first record


def test_an_older_manager_gets_a_bare_command_ack(tmp_path: Path) -> None:
    hub = HubStub()  # its Welcome carries no protocol_minor
    _run_one_trial(tmp_path, hub)
    acks = [m.command_ack.cmd_seq for m in hub.received if m.WhichOneof("body") == "command_ack"]
    assert acks == [1], hub.received
    assert not any(m.command_acked for m in hub.received)  # an unknown field to it
