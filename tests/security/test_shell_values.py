"""Every config value that reaches a shell is quoted or refused. Each field gets a newline, a
quote and `$(...)`: names that end up in `export NAME=` lines or `#SBATCH` directives are
refused naming the field; values are quoted so that a real shell (or Python, for the image
name in the REST platforms' boot program) reads them back unchanged and runs nothing."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nni_manager.backends.remote.bootstrap import parse_probe, probe_command
from nni_manager.backends.rest_jobs import agent_boot
from nni_manager.config import ConfigError
from tests.support.dry_run import ALGORITHM, dry_run_env
from nni_manager.loader import load_config

HOSTILE = ["a\nb", "a'b\"c", "$(touch PWNED)", "`touch PWNED`", "x; touch PWNED"]


def _config(tmp: Path, ts: dict) -> Path:
    path = tmp / "config.yml"
    path.write_text(yaml.safe_dump({"trialCommand": "python3 t.py", "trialCodeDirectory": str(tmp),
                                    "trialConcurrency": 1, "trainingService": ts, **ALGORITHM}))
    return path


def _dry_run(config: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "nni_manager", "run", "--dry-run", str(config)],
                         capture_output=True, text=True, env=dry_run_env(config.parent))
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("name", HOSTILE + ["1ABC", "A-B", ""])
def test_agent_env_names_are_refused(name: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_config(tmp_path, {"platform": "local", "agentEnv": {name: "v", "CUDA_HOME": "/cuda"}}))
    assert err.value.field.startswith("trainingService.agentEnv") and "variable name" in err.value.problem


@pytest.mark.parametrize("field", ["partition", "account", "qos"])
@pytest.mark.parametrize("value", HOSTILE)
def test_slurm_names_are_refused(field: str, value: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_config(tmp_path, {"platform": "slurm", field: value}))
    assert err.value.field == f"trainingService.{field}"


def test_sbatch_option_with_a_newline_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"sbatchOptions\[0\]"):
        load_config(_config(tmp_path, {"platform": "slurm", "sbatchOptions": ["--constraint=a\ntouch PWNED"]}))


@pytest.mark.parametrize("value", HOSTILE)
def test_agent_env_values_reach_the_batch_script_quoted(value: str, tmp_path: Path) -> None:
    script = _dry_run(_config(tmp_path, {"platform": "slurm", "partition": "p", "nniManagerIp": "127.0.0.9", "agentEnv": {"HOSTILE_VALUE": value}}))
    exports = [line for line in _script_lines(script) if line.startswith("export HOSTILE_VALUE=")]
    assert len(exports) == 1, script
    out = subprocess.run(["sh", "-c", exports[0] + '\nprintf %s "$HOSTILE_VALUE"'], cwd=tmp_path,
                         capture_output=True, text=True, check=True)
    assert out.stdout == value and not (tmp_path / "PWNED").exists()


def _script_lines(script: str) -> list[str]:
    """The shell lines of a batch script (a quoted value may span lines: join them back)."""
    lines: list[str] = []
    for raw in script.splitlines():
        if lines and _open_quote(lines[-1]):
            lines[-1] += "\n" + raw
        else:
            lines.append(raw)
    return lines


def _open_quote(line: str) -> bool:
    try:
        shlex.split(line)
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("value", ["/opt/$(touch PWNED)/bin", "/opt/`touch PWNED`/bin", '/opt/a"b/bin'])
def test_python_path_in_the_probe_runs_nothing(value: str, tmp_path: Path) -> None:
    out = subprocess.run(["sh", "-c", probe_command(value, "tag", None)], cwd=tmp_path, capture_output=True,
                         text=True, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert not (tmp_path / "PWNED").exists()
    probe = parse_probe(out.stdout)
    assert probe.python is None and len(probe.rejected) == 2 and all(value in r for r in probe.rejected)


def test_python_path_with_a_newline_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"machineList\[0\]\.pythonPath"):
        load_config(_config(tmp_path, {"platform": "remote", "machineList": [
            {"host": "127.0.0.1", "user": "u", "password": "p", "pythonPath": "/usr/bin\ntouch PWNED"}]}))


@pytest.mark.parametrize("image", ["python:3.11'; import os; os.system('touch PWNED') #", 'img"\nx', "a\\'b"])
def test_image_name_is_one_argument_of_the_fixed_boot_program(image: str) -> None:
    """The boot program is boot.py's own text, whatever the config says; the image name reaches it
    as one shell-quoted argument (for its failure line), never as code."""
    from nni_manager.backends.agent_command import inline_source

    lines = agent_boot(hub_address="127.0.0.1:1", agent_id="a", token_lines=[], tls=False, ca_lines=[],
                       orphan_timeout=60, single_trial=False, env={}, image=image)
    argv = shlex.split(lines[-1])
    assert argv[:3] == ["exec", "$PY", "-c"]
    assert argv[3] == inline_source()
    assert argv[argv.index("--where") + 1] == " ".join(f"the image {image}".split())  # one line: no newline

@pytest.mark.parametrize("tmpdir", ["usable", "$HOME/tmp", None])
def test_the_agent_s_private_directory_is_made_in_the_job_s_tmpdir_when_usable(tmp_path: Path,
                                                                               tmpdir: str | None) -> None:
    """A job's TMPDIR (a scratch disk) holds the agent's private 0700 directory when it names one; an
    unusable one (DLTS passes `$HOME/tmp` unexpanded) or none falls back to /tmp; `set -eu` never trips."""
    lines = agent_boot(hub_address="127.0.0.1:1", agent_id="a", token_lines=[], tls=False, ca_lines=[],
                       orphan_timeout=60, single_trial=False, env={}, image="img")
    made = next(line for line in lines if line.startswith("NNI_AGENT_DIR="))
    env = {"PATH": os.environ["PATH"]}
    if tmpdir is not None:
        env["TMPDIR"] = str(tmp_path) if tmpdir == "usable" else tmpdir
    out = subprocess.run(["sh", "-c", f'set -eu\numask 077\n{made}\necho "$NNI_AGENT_DIR"\nrmdir "$NNI_AGENT_DIR"'],
                         capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    where = Path(out.stdout.strip())
    assert where.parent == (tmp_path if tmpdir == "usable" else Path("/tmp")) and where.name.startswith("nni-agent.")
