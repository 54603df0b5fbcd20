"""trial.log (NNI's SDK log) is streamed like stdout, but only to a manager that knows the stream:
an older manager would file its chunks as stdout."""
from __future__ import annotations

from pathlib import Path

from nni_agent.v1 import agent_pb2 as pb
from tests.support.agent.hubstub import HubStub, StubServer, start_trial
from tests.support.agent.prodhub import ProdHub
from tests.support.bounded import run_bounded

WRITE_BOTH = 'echo sdk log > "$NNI_OUTPUT_DIR/trial.log"; echo out'


def test_current_manager_gets_trial_log_chunks_filed_as_trial_log(tmp_path: Path, short_dir: Path) -> None:
    async def scenario() -> None:
        async with ProdHub(short_dir / "exp") as hub:  # the production hub: its Welcome says protocol 1.2+
            await hub.connect_agent(tmp_path / "w")
            hub.start_trial("agent-1", "log02", WRITE_BOTH)
            await hub.wait_for(lambda: hub.trials["log02"].final is not None
                               and bytes(hub.trials["log02"].logs[pb.LOG_STREAM_TRIAL_LOG]) == b"sdk log\n",
                               30, "the trial and its trial.log")
        trial = hub.trials["log02"]
        assert trial.final.state == pb.TRIAL_STATE_SUCCEEDED, trial.final
        assert bytes(trial.logs[pb.LOG_STREAM_STDOUT]) == b"out\n"
        files = hub.experiment_dir / "trials" / "log02"  # where the hub wrote the chunks (handler.log_file)
        assert (files / "trial.log").read_text() == "sdk log\n" and (files / "trial.stdout").read_text() == "out\n"

    run_bounded(scenario(), 120)


def test_older_manager_gets_no_trial_log_chunks(tmp_path: Path) -> None:
    async def scenario() -> None:
        hub = HubStub()  # its Welcome carries no protocol_minor: a manager from before LOG_STREAM_TRIAL_LOG
        async with StubServer(hub) as srv:
            await srv.connect_agent(tmp_path / "w")
            hub.send(**start_trial("log01", WRITE_BOTH))
            await hub.wait_for(lambda: hub.trials["log01"].final is not None)
        trial = hub.trials["log01"]
        assert trial.final is not None and trial.final.state == pb.TRIAL_STATE_SUCCEEDED, trial.final
        assert bytes(trial.logs[pb.LOG_STREAM_STDOUT]) == b"out\n"  # nothing of trial.log mixed in
        assert pb.LOG_STREAM_TRIAL_LOG not in trial.logs
        written = list((tmp_path / "w").rglob("trial.log"))
        assert [p.read_text() for p in written] == ["sdk log\n"]  # the trial did write one

    run_bounded(scenario(), 120)
