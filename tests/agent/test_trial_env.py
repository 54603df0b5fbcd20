"""The NNI environment contract a trial sees (nni-training-service.md §1.1)."""
from __future__ import annotations

import json
from pathlib import Path

from nni_agent.http_channel import HttpChannelServer
from nni_agent.v1 import agent_pb2 as pb
from tests.support.agent.trialkit import AGENT_KEY, python_command, run_trial

DUMP_ENV = python_command(
    "import json, os, sys; sys.stdout.write(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd(), "
    "'param': open(os.path.join(os.environ['NNI_SYS_DIR'], 'parameter.cfg')).read(), "
    "'nni_dir': os.path.isdir(os.path.join(os.environ['NNI_SYS_DIR'], '.nni'))}))"
)


def _dump(tmp_path: Path, **fields: object) -> tuple[dict, pb.TrialStatus]:
    rec, _ = run_trial(tmp_path, DUMP_ENV, **fields)
    assert rec.terminal is not None and rec.terminal.state == pb.TRIAL_STATE_SUCCEEDED, rec.terminal
    return json.loads(rec.stdout), rec.terminal


def test_default_environment(tmp_path: Path) -> None:
    out, status = _dump(tmp_path, code_directory=tmp_path)
    env = out["env"]
    sys_dir = tmp_path / "work" / "expABCDE" / "trials" / "trA01"
    assert env["NNI_PLATFORM"] == "local"
    assert env["NNI_EXP_ID"] == "expABCDE"
    assert env["NNI_TRIAL_JOB_ID"] == "trA01"
    assert env["NNI_SYS_DIR"] == str(sys_dir)
    assert env["NNI_OUTPUT_DIR"] == str(sys_dir)
    assert env["NNI_TRIAL_SEQ_ID"] == "7"
    assert env["NNI_CODE_DIR"] == str(tmp_path) == out["cwd"]
    assert env["MULTI_PHASE"] == "true"
    assert env["NNI_AGENT_TRIAL_KEY"] == f"{AGENT_KEY}/trA01"
    assert "NNI_TRIAL_COMMAND_CHANNEL" not in env
    assert json.loads(out["param"])["parameters"] == {"lr": 0.1}
    assert out["nni_dir"]
    assert status.working_directory == str(sys_dir)


def test_explicit_dirs_platform_and_overrides(tmp_path: Path) -> None:
    work = tmp_path / "sys"
    output = tmp_path / "out"
    out, _ = _dump(tmp_path, working_directory=str(work), output_directory=str(output),
                   platform="remote", env={"MY_VAR": "x", "NNI_PLATFORM": "custom"})
    env = out["env"]
    assert env["NNI_SYS_DIR"] == str(work)
    assert env["NNI_OUTPUT_DIR"] == str(output) and output.is_dir()
    assert env["NNI_PLATFORM"] == "custom"  # spec.env is applied last
    assert env["MY_VAR"] == "x"


def test_cwd_defaults_to_sys_dir_without_code_directory(tmp_path: Path) -> None:
    out, _ = _dump(tmp_path, code_directory="")
    assert out["cwd"] == out["env"]["NNI_SYS_DIR"] == out["env"]["NNI_CODE_DIR"]


def test_cuda_visible_devices(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "inherited")
    out, _ = _dump(tmp_path / "a", gpus=pb.GpuAssignment(scheduled=True, indices=[0, 2]))
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == "0,2"
    out, _ = _dump(tmp_path / "b", gpus=pb.GpuAssignment(scheduled=True))
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == ""
    out, _ = _dump(tmp_path / "c")
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == "inherited"


def test_http_channel_url_and_forced_legacy(tmp_path: Path) -> None:
    server = HttpChannelServer()
    server.start()
    try:
        out, _ = _dump(tmp_path / "a", http=server)
        prefix, env_id, trial_id = out["env"]["NNI_TRIAL_COMMAND_CHANNEL"].rsplit("/", 2)
        assert (prefix, trial_id) == (f"http://127.0.0.1:{server.port}/env", "trA01")
        assert env_id != AGENT_KEY and len(env_id) >= 24  # a per-trial secret (tests/security)
        out, _ = _dump(tmp_path / "b", http=server, env={"NNI_TRIAL_COMMAND_CHANNEL": ""})
        assert out["env"]["NNI_TRIAL_COMMAND_CHANNEL"] == ""
    finally:
        server.close()
