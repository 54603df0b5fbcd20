"""Every backend starts the agent through the one boot step with a command line from AgentCommand:
each backend's produced command (its dry run, what it would submit) is taken apart here and read
by the agent's own argument parser (`nni_agent.cli.parse_args`) and the boot step's (`Boot`)."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from nni_agent.boot import Boot
from nni_agent.cli import parse_args
from nni_manager.backends.agent_command import AgentCommand, Sh, inline_source
from nni_manager.backends.registry import backend_class
from nni_manager.loader import load_config

HUB = "10.0.0.5"  # not dialed: data only


def cfg(tmp_path: Path, ts: dict[str, Any]) -> Any:
    return load_config({"trialCommand": "python3 t.py", "trialConcurrency": 1, "trialCodeDirectory": str(tmp_path),
                        "trainingService": ts})


def dry(tmp_path: Path, ts: dict[str, Any]) -> Any:
    return backend_class(ts["platform"])(cfg(tmp_path, ts)).render()


def split_boot(words: list[str], agent_words: list[str] | None = None) -> tuple[list[str], Boot, argparse.Namespace]:
    """[python, boot file | -c SOURCE, boot options..., --, agent arguments...] -> its parts, parsed
    (`agent_words`: the agent's arguments, where the command has a word standing for them)."""
    cut = words.index("--")
    head, agent = words[:cut], words[cut + 1:]
    if head[1] == "-c":
        assert head[2] == inline_source()
        head, opts = head[:3], head[3:]
    else:
        head, opts = head[:2], head[2:]
    return head, Boot(opts + ["--"]), parse_args(agent if agent_words is None else agent_words)


def exec_words(script: str) -> list[str]:
    """The words of the script's last `exec "$PY" ...` command (up to a redirection)."""
    return shlex.split(script[script.rindex('exec "$PY"'):])[1:]


def test_local_runs_the_boot_file_with_the_managers_python(tmp_path: Path) -> None:
    (argv,) = dry(tmp_path, {"platform": "local"}).requests
    head, boot, args = split_boot(argv)
    assert head == [sys.executable, str(Path(__import__("nni_agent.boot").boot.__file__))]
    assert args.manager == "unix:<experiment dir>/hub.sock" and args.agent_id == "local"
    assert str(args.work_dir) == "<experiment dir>/agents/local" and args.token_file is None  # NNI_AGENT_TOKEN
    assert boot.where == "the manager's machine" and boot.paths == []


def test_remote_start_command(tmp_path: Path) -> None:
    ts = {"platform": "remote", "machineList": [{"host": "127.0.0.1", "user": "u", "password": "p",
                                                 "pythonPath": "/opt/py/bin"}]}
    (request,) = dry(tmp_path, ts).requests
    line = next(ln for ln in request["start_command"].splitlines() if " setsid " in ln)
    words = shlex.split(line.split(" setsid ", 1)[1])
    words = words[:words.index("</dev/null")]
    head, boot, args = split_boot(words)
    assert head == ["<python found by the probe>", "$HOME/.nni-agent/0.1.0-<hash>/lib/nni_agent/boot.py"]
    assert boot.paths == ["$HOME/.nni-agent/0.1.0-<hash>/lib", "$HOME/.nni-agent/0.1.0-<hash>/deps-<py>"]
    assert str(args.manager_file) == "$HOME/.nni-agent/run/<experiment-id>/<agent-id>.manager"
    assert str(args.token_file) == "$HOME/.nni-agent/run/<experiment-id>/<agent-id>.token"
    assert str(args.ca_file) == "$HOME/.nni-agent/run/<experiment-id>/<agent-id>.ca.crt"
    assert str(args.log_file) == "$HOME/.nni-agent/run/<experiment-id>/<agent-id>.log"
    assert args.agent_id == "<agent-id>" and args.orphan_timeout > 0 and not args.single_trial
    assert line.startswith("PATH=/opt/py/bin:")  # NNI's pythonPath: in front of PATH


def test_kubernetes_container_command(tmp_path: Path) -> None:
    pod = dry(tmp_path, {"platform": "kubernetes", "hubPort": 8443, "nniManagerIp": HUB}).requests[-1]
    (container,) = pod["spec"]["containers"]
    sh, dash_c, script, name, *agent = container["command"]
    assert (sh, dash_c, name) == ("sh", "-c", "nni-agent-boot")
    words = exec_words(script)
    assert words[-1] == "$@"  # the agent's arguments: the positional ones
    head, boot, args = split_boot(words[:-1], agent)
    assert head[:2] == ["$PY", "-c"]  # boot.py inline: no ConfigMap editor can change it
    assert boot.wheel == "/var/run/nni/agent/nni_agent-<version>-py3-none-any.whl"
    assert list(boot.digests) == ["nni_agent-<version>-py3-none-any.whl"]  # the wheel runs only if its sha256 fits
    assert boot.unpack_to == "/var/run/nni/work/agent-<version>-<hash>" and boot.agent_id_env == "NNI_AGENT_ID"
    assert boot.message_file == "/dev/termination-log" and boot.where == f"the image {container['image']}"
    assert args.manager == f"{HUB}:8443" and args.agent_id == "{agent}" and str(args.token_file) == \
        "/var/run/nni/secret/{agent}"
    assert str(args.ca_file) == "/var/run/nni/secret/ca.crt" and str(args.work_dir) == "/var/run/nni/work"


def test_slurm_batch_script(tmp_path: Path) -> None:
    (request,) = dry(tmp_path, {"platform": "slurm", "pythonPath": "/opt/py/bin/python3", "nniManagerIp": HUB,
                                "trialMemorySize": "1gb"}).requests
    script = request["script"]
    inner = shlex.split(script[script.index("\nexec srun "):])[-1]
    assert "for c in /opt/py/bin/python3; do" in inner  # pythonPath: that interpreter only
    head, boot, args = split_boot(exec_words(inner))
    assert head[0] == "$PY" and boot.where == "the compute node"
    assert boot.paths == [] and boot.wheel == "<experiment dir>/agent-wheel/nni_agent-<version>-py3-none-any.whl"
    assert boot.unpack_to == "$NNI_SLURM_JOB_DIR/agent"  # the job's private directory, verified by its digest
    assert list(boot.digests) == ["nni_agent-<version>-py3-none-any.whl"]
    assert args.agent_id == "$id" and str(args.token_file) == "$NNI_SLURM_JOB_DIR/$id.token"
    assert args.manager.startswith(f"{HUB}:") and str(args.ca_file) == "$NNI_SLURM_JOB_DIR/ca.crt"
    assert str(args.work_dir) == "$NNI_SLURM_JOB_DIR/work-$SLURM_PROCID"


REST = {
    "openpai": {"host": "pai.example.com", "username": "u", "token": "t", "trialMemorySize": "1gb",
                "dockerImage": "msranni/nni:latest"},
    "dlts": {"dashboard": "http://dash.example", "team": "t", "email": "e@x", "password": "pw", "image": "img:1",
             "trialGpuNumber": 1},
    "aml": {"subscriptionId": "sub", "resourceGroup": "rg", "workspaceName": "ws", "computeTarget": "gpu",
            "dockerImage": "msranni/nni:latest"},
}


def _rest_command(platform: str, request: Any) -> str:
    if platform == "openpai":
        return "\n".join(request["taskRoles"]["taskrole"]["commands"])
    if platform == "dlts":
        return request["cmd"]
    return request["properties"]["command"]


@pytest.mark.parametrize("platform", sorted(REST))
def test_rest_platforms_check_python_and_dependencies(tmp_path: Path, platform: str) -> None:
    """OpenPAI, DLTS and AML: boot.py travels inline (the image may lack the agent), so a bad image
    ends as the boot step's one line, not as a platform's "exit code 1"."""
    request = dry(tmp_path, {"platform": platform, "nniManagerIp": HUB, **REST[platform]}).requests[-1]
    script = _rest_command(platform, request)
    head, boot, args = split_boot(exec_words(script))
    assert head[:2] == ["$PY", "-c"]
    image = REST[platform].get("dockerImage") or REST[platform].get("image")
    assert boot.where == f"the image {image}"
    assert args.manager.startswith(f"{HUB}:") and str(args.token_file) == "$NNI_AGENT_DIR/token"
    assert str(args.work_dir) == "$NNI_AGENT_DIR/work" and str(args.ca_file) == "$NNI_AGENT_DIR/ca.crt"
    assert "for c in python3 python; do" in script


def test_shell_quotes_values_and_keeps_backend_words() -> None:
    c = AgentCommand(agent_id="a'; touch PWNED", manager="h:1", token_file=Sh('"$D/token"'),
                     python_dir="/opt/my py", where="the image x\ny")
    line = c.shell_lines()[1]
    words = shlex.split(line)
    assert words[words.index("--agent-id") + 1] == "a'; touch PWNED" and '"$D/token"' in line
    assert words[words.index("--where") + 1] == "the image x y"
    assert "'/opt/my py/python3' '/opt/my py/python'" in c.find_python()
