"""Secrets by value, not only by name: `PIP_INDEX_URL` (or any `*_URL`/`*_URI`) with a password in
its userinfo, a `*_PROXY` with credentials, and environment names with `TOKEN`, `AUTH`, `COOKIE` or
`JWT` as a word are stored redacted and never reach pod specs or job commands in clear: they travel
as the other secrets do, to the trial over the agent's authenticated stream."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nni_manager.config import REDACTED, ExperimentConfig, TrainingServiceConfig, is_secret_entry, redacted, secret_values
from nni_manager.service import create_training_service
from tests.support.dry_run import ALGORITHM, dry_run_env
from tests.support.security.platforms import PLATFORMS
from tests.support.manager.helpers import form, wait_status
from tests.support.bounded import run_bounded

PW = "pw-" + hashlib.sha256(b"by value").hexdigest()[:12]
SECRET_ENV = {
    "PIP_INDEX_URL": f"https://alice:{PW}@pypi.example.invalid/simple",  # not dialed
    "PIP_EXTRA_INDEX_URL": f"https://pypi.org/simple https://__token__:{PW}-x@gitlab.example.invalid/simple",
    "MLFLOW_TRACKING_URI": f"https://bob:{PW}-m@mlflow.example.invalid",  # not dialed
    "HTTPS_PROXY": f"http://carol:{PW}-p@proxy.example.invalid:3128",  # not dialed
    "http_proxy": f"dave:{PW}-q@proxy.example.invalid:3128",  # not dialed
    "GITLAB_TOKEN_RW": f"{PW}-g",
    "BASIC_AUTH_HEADER": f"Basic {PW}-b",
    "SESSION_COOKIE": f"{PW}-c",
    "JWT": f"{PW}-j",
}
VISIBLE_ENV = {
    "PIP_INDEX_URL_PUBLIC": "https://pypi.org/simple",
    "HTTP_PROXY": "http://proxy.example.invalid:3128",  # not dialed
    "NO_PROXY": "localhost,127.0.0.1",
    "TOKENIZERS_PARALLELISM": "false",
    "DOCS_URL": "https://user@docs.example.invalid/",  # a user, no password: no secret in a URL  # not dialed
}


@pytest.mark.parametrize("name", sorted(SECRET_ENV))
def test_a_secret_by_value_or_name_is_stored_redacted(name: str) -> None:
    assert is_secret_entry(name, SECRET_ENV[name])
    assert redacted({"agentEnv": {name: SECRET_ENV[name]}})["agentEnv"][name] == REDACTED
    assert SECRET_ENV[name] in secret_values({"agentEnv": {name: SECRET_ENV[name]}})  # masked in the log


@pytest.mark.parametrize("name", sorted(VISIBLE_ENV))
def test_other_values_stay_visible(name: str) -> None:
    assert not is_secret_entry(name, VISIBLE_ENV[name])
    assert redacted({"agentEnv": {name: VISIBLE_ENV[name]}})["agentEnv"][name] == VISIBLE_ENV[name]


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_what_is_submitted_holds_no_secret_by_value(platform: str, tmp_path: Path) -> None:
    config = tmp_path / f"{platform}.yml"
    env = {**SECRET_ENV, **VISIBLE_ENV}
    config.write_text(yaml.safe_dump({
        "trialCommand": "python3 t.py", "trialCodeDirectory": str(tmp_path), "trialConcurrency": 1,
        **ALGORITHM, "trialGpuNumber": 0, "trainingService": {"platform": platform, "agentEnv": env, **PLATFORMS[platform]}}))
    out = subprocess.run([sys.executable, "-m", "nni_manager", "run", "--dry-run", str(config)],
                         capture_output=True, text=True, env=dry_run_env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "TOKENIZERS_PARALLELISM" in out.stdout  # the visible variables are still submitted
    assert PW not in out.stdout and PW not in out.stderr, [line for line in out.stdout.splitlines() if PW in line]


def test_the_trial_gets_them_and_the_store_does_not(short_dir: Path) -> None:
    code = short_dir / "code"
    code.mkdir()
    (code / "trial.py").write_text(
        "import os\n"
        f"print(all(os.environ[k] == v for k, v in {SECRET_ENV!r}.items()))\n")
    cfg = ExperimentConfig(trial_command=f"{sys.executable} trial.py", trial_code_directory=code,
                           experiment_working_directory=short_dir / "exps",
                           training_service=TrainingServiceConfig(platform="local", agent_env=dict(SECRET_ENV)))

    async def body() -> tuple[str, Path]:
        async with create_training_service(cfg) as ts:
            done = await wait_status(ts, (await ts.submit_trial_job(form(0))).id, "SUCCEEDED", "FAILED")
            assert done.status.value == "SUCCEEDED", done.message
            return str(await ts.get_trial_file(done.id, "trial.stdout")), ts.experiment_dir

    stdout, experiment_dir = run_bounded(body(), 60)
    assert stdout.splitlines() == ["True"], stdout
    for path in experiment_dir.rglob("*"):
        if path.is_file() and not path.name.startswith("trial."):
            assert PW.encode() not in path.read_bytes(), f"{path} holds a secret in clear"
