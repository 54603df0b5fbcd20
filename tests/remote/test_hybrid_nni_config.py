"""NNI's own hybrid config, examples/trials/mnist-pytorch/config_hybrid.yml (local + remote + aml),
run with its placeholders pointed at the test beds: the SSH machine is a real sshd on 127.0.0.1,
AML is the AML emulator (tests/aml). The machine entry also gets the test bed's port, known-hosts
file and Python (the config's `host`/`user` name a machine on port 22 with Python on PATH), and
the AML entry its endpoint override; nothing else changes. Trials run on all three platforms."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.aml.fixtures import aml, aml_factory  # noqa: F401 (fixtures)
from tests.support.manager.helpers import form, until, wait_status
from tests.support.remote.fixtures import processes_with
from tests.support.bounded import run_bounded

pytestmark = pytest.mark.ssh
NNI_CONFIG = (Path(__file__).resolve().parents[1] / "experiment" / "nni_configs" / "examples" / "trials" /
              "mnist-pytorch" / "config_hybrid.yml")
# the trial NNI's config runs (`python3 mnist.py`), reduced to saying where it ran
MNIST = 'import os, time\nprint("ran on", os.environ["NNI_PLATFORM"], flush=True)\ntime.sleep(2)\n'


def test_nni_hybrid_config_runs_on_local_remote_and_aml(plain_sshd: Any, aml: Any, short_dir: Path,  # noqa: F811
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    home = short_dir / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_bytes(Path(plain_sshd.machine.ssh_key_file).read_bytes())
    (home / ".ssh" / "id_rsa").chmod(0o600)
    monkeypatch.setenv("HOME", str(home))  # the config's ssh_key_file: ~/.ssh/id_rsa
    code = short_dir / "code"
    code.mkdir()
    (code / "mnist.py").write_text(MNIST)
    (code / "search_space.json").write_text((NNI_CONFIG.parent / "search_space.json").read_text())
    text = NNI_CONFIG.read_text()
    for placeholder, value in {"your server's IP or domain name": "127.0.0.1", "your user name": plain_sshd.machine.user,
                               "your subscription ID": aml.subscription_id, "your resource group": aml.resource_group,
                               "your workspace name": aml.workspace_name, "your compute target": aml.compute}.items():
        text = text.replace("${" + placeholder + "}", value)
    assert not re.search(r"\$\{", text), text
    data = yaml.safe_load(text)
    local, remote, aml_ts = data["trainingService"]
    remote["machineList"][0].update(port=plain_sshd.port, knownHostsFile=str(plain_sshd.machine.known_hosts_file),
                                    pythonPath=plain_sshd.machine.python_path)
    aml_ts.update(resourceManagerEndpoint=aml.url, pollInterval="0.3s")
    data.update(nniManagerIp="127.0.0.1", experimentWorkingDirectory=str(short_dir / "exps"), trialGracePeriod=2)
    (code / "config_hybrid.yml").write_text(yaml.safe_dump(data))
    cfg = load_config(code / "config_hybrid.yml")
    assert [s.platform for s in cfg.training_service.options.services] == ["local", "remote", "aml"]

    async def body() -> tuple[str, set[str]]:
        async with create_training_service(cfg) as ts:
            fixed = lambda: [a for a in ts.agents() if a["environment"] is None]  # noqa: E731
            await until(lambda: len(fixed()) == 2 and all(a["connected"] for a in fixed()), 90, "local and remote")
            trials = [await ts.submit_trial_job(form(i)) for i in range(5)]  # trialConcurrency: 5
            done = [await wait_status(ts, t.id, "SUCCEEDED", timeout=120) for t in trials]
            remote_id = next(a["agent_id"] for a in fixed() if a["agent_id"] != "local")
            where = {"local" if d.agent_id == "local" else "remote" if d.agent_id == remote_id
                     else "aml" if d.environment_id else d.agent_id for d in done}
            outputs = {(await ts.get_trial_file(d.id, "trial.stdout")).strip() for d in done}
            assert outputs <= {"ran on local", "ran on remote", "ran on aml"}, outputs
            return ts.experiment_id, where

    experiment_id, where = run_bounded(body(), 240)
    assert where == {"local", "remote", "aml"}, where
    assert processes_with(f"NNI_EXP_ID={experiment_id}".encode()) == []
    aml.wait_for(lambda: not aml.live_pids(), 60, what="no AML job process left")
