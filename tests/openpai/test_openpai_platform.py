"""`platform: openpai` end to end on the OpenPAI rest-server emulator (tests/support/openpai/fixtures.py):
the backend's real HTTP client (aiohttp) submitting job protocol YAML, real agents in the jobs'
task processes dialling the manager's TLS hub on 127.0.0.1. PAI's own status paths, reuse and
non-reuse, a 2-instance task role, secrets, PAI's errors, cleanup and the dry run. (What every job
platform does alike: a failed or cancelled trial, a wrong token, REST faults, in tests/platforms.)"""
from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from nni_manager.backends.registry import backend_class
from nni_manager.config import ConfigError
from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.manager.helpers import form, sleeper, wait_status
from tests.support.openpai.experiments import assert_clean, base, config, config_dict, ours, run  # noqa: F401 (base: a fixture)

T = 90.0  # generous polling timeout: two cores shared with other test runs


def fast_pai(pai_factory: Any, **options: Any) -> Any:
    """An emulator whose list rate limit allows polling twice a second (the real one: 60/min)."""
    return pai_factory(rate_limits={"list": 0}, **options)


# ----------------------------------------------------------------------------- every status path

def test_status_paths_one_job_per_trial(pai_factory, base: Path) -> None:
    """reuseMode false: one job per trial. SUCCEEDED (metrics exactly once, PAI's job page URL),
    cleanup; secrets never in the job config PAI serves. (FAILED, cancelled by us, WAITING in a full
    virtual cluster, stopped by someone else in PAI, every job platform alike:
    tests/platforms/test_job_{failure,cancel,waiting,contract}.py.)"""
    pai = fast_pai(pai_factory)
    cfg = config(pai, base, {"reuseMode": False})
    metrics: dict[str, list[str]] = defaultdict(list)
    tokens: list[str] = []

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            exp = ts.experiment_id
            ts.add_trial_job_metric_listener(lambda m: metrics[m.id].append(m.data))
            ok = await ts.submit_trial_job(form(0, x=7, steps=3))
            d = await wait_status(ts, ok.id, "SUCCEEDED", timeout=T)
            got = [json.loads(m) for m in metrics[ok.id]]
            assert [(g["type"], g["sequence"], json.loads(g["value"])) for g in got] == [
                ("PERIODICAL", 0, 0), ("PERIODICAL", 1, 1), ("PERIODICAL", 2, 2), ("FINAL", 0, 7)], got
            name = f"nni_exp_{exp}_trial_{ok.id}"
            assert d.url == f"{pai.url}/job-detail.html?username={pai.username}&jobName={name}", d.url
            pai.wait_state(name, "SUCCEEDED", timeout=T)  # the job's own state follows the trial

            tokens.extend(a["token"] for a in ts.trials.store.agents())
            return exp

    exp = run(main())
    assert all(len(ms) == len(set(ms)) for ms in metrics.values()), metrics
    assert_clean(pai, exp)
    jobs = ours(pai, exp)
    assert len(jobs) == 1, jobs
    # secrets: in the protocol's `secrets` (masked when PAI serves the config), never in commands or logs
    assert tokens and all(tokens)
    requests = pai.requests()
    submits = [r for r in requests if r["method"] == "POST" and r["path"].endswith("/jobs")]
    assert submits and all(r["contentType"].startswith("text/yaml") for r in submits), submits
    import urllib.request
    for j in jobs:
        req = urllib.request.Request(f"{pai.api}/jobs/{pai.username}~{j['name']}/config",
                                     headers={"Authorization": f"Bearer {pai.token}"})
        served = urllib.request.urlopen(req, timeout=10).read().decode()
        assert "<% $secrets.nni_agent_token_taskrole_0 %>" in served, served[:2000]
        assert not any(t in served for t in tokens)
    logs = "".join(f.read_text(errors="replace") for f in (base / "exps" / exp).rglob("*.log") if f.is_file())
    assert not any(t in logs for t in tokens) and pai.token not in logs


def test_reuse_pool_runs_ten_trials_on_two_environments(pai_factory, base: Path) -> None:
    pai = fast_pai(pai_factory)
    cfg = config(pai, base, {}, trialConcurrency=2)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            trials = [await ts.submit_trial_job(form(i, x=i, steps=1)) for i in range(10)]
            for t in trials:
                await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            envs = {(await ts.get_trial_job(t.id)).environment_id for t in trials}
            assert envs == {"env1", "env2"}, envs
            exp = ts.experiment_id
            names = sorted(j["name"] for j in ours(pai, exp))
            assert names == [f"nni_exp_{exp}_env_1", f"nni_exp_{exp}_env_2"], names
            assert all(j["state"] == "RUNNING" for j in ours(pai, exp))  # kept for the next trials
            return exp

    exp = run(main())
    assert_clean(pai, exp)  # clean_up stopped both environments
    # stopped, or succeeded when its agents were told to stop before PAI's STOP landed
    assert all(j["state"] in ("STOPPED", "SUCCEEDED") for j in ours(pai, exp)), ours(pai, exp)


def test_two_instance_task_role_from_openpai_config(pai_factory, base: Path) -> None:
    """The user's own job protocol: a task role with 2 instances runs one agent per instance, the
    role's commands on each, with PAI's environment (role, index, peer hosts) passed through."""
    pai = fast_pai(pai_factory)
    protocol = {
        "protocolVersion": 2, "name": "my-job", "type": "job",
        "prerequisites": [{"type": "dockerimage", "uri": "python:3.11", "name": "img"}],
        "taskRoles": {"worker": {"instances": 2, "dockerImage": "img",
                                 "resourcePerInstance": {"cpu": 1, "memoryMB": 512, "gpu": 0},
                                 "commands": [f"{sys.executable} peers.py"]}},
    }
    data = config_dict(pai, base, {"reuseMode": False, "openpaiConfig": protocol})
    del data["trialCommand"]
    cfg = load_config(data)

    async def main() -> tuple[str, dict[str, dict[str, Any]]]:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            assert len(d.agents) == 2, d
            rep = ts.experiment_dir / "trials" / t.id / "replicas"
            views = {}
            for r in sorted(p.name for p in rep.iterdir()):
                line = next(ln for ln in (rep / r / "trial.stdout").read_text().splitlines() if ln.startswith("SEEN "))
                views[r] = json.loads(line[5:])
            return ts.experiment_id, views

    exp, views = run(main())
    assert sorted(views) == ["worker-0", "worker-1"], views  # one replica per instance: role and index
    by_index = {v["PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"]: v for v in views.values()}
    assert set(by_index) == {"0", "1"}
    for idx, v in by_index.items():
        assert v["PAI_CURRENT_TASK_ROLE_NAME"] == "worker" and v["NNI_TRIAL_ROLE"] == "worker"
        assert v["NNI_TRIAL_ROLE_INDEX"] == idx and v["PAI_TASK_ROLE_TASK_COUNT_worker"] == "2"
        assert v["PAI_HOST_IP_worker_0"] == v["PAI_HOST_IP_worker_1"] == "127.0.0.1"
    for r, v in views.items():  # replica worker-<i> is the agent of task index i
        assert r == "worker-" + v["PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"]
    assert_clean(pai, exp)


def test_user_protocol_commands_keep_pais_template_variables(pai_factory, base: Path) -> None:
    """A role's commands with PAI's template variables run as PAI renders them: `<% $parameters.x %>`,
    `$script`, `$data` and `$output` at the rest-server, `<% $secrets.x %>` in the container, shell
    variables by the trial's own shell (NNI kept them in the PAI command; sent raw to a shell they
    end as "Syntax error: redirection unexpected")."""
    pai = fast_pai(pai_factory)
    secret = "user-secret-31337"
    protocol = {
        "protocolVersion": 2, "name": "my-job", "type": "job",
        "prerequisites": [{"type": "dockerimage", "uri": "python:3.11", "name": "img"},
                          {"type": "script", "name": "bench", "uri": "github.com/example/bench"},
                          {"type": "data", "name": "cifar", "uri": ["https://data.example/cifar.tgz"]},  # not dialed
                          {"type": "output", "name": "models", "uri": "hdfs://out.example/models"}],  # not dialed
        "parameters": {"model": "resnet20", "lr": 0.1},
        "secrets": {"api_key": secret},
        "taskRoles": {"worker": {
            "instances": 1, "dockerImage": "img", "script": "bench", "data": "cifar", "output": "models",
            "resourcePerInstance": {"cpu": 1, "memoryMB": 512, "gpu": 0},
            "commands": ['echo PARAMS <% $parameters.model %> <% $parameters.lr %>',  # as PAI's examples: unquoted
                         'echo "PREREQ <% $script.name %> <% $data.uri[0] %> <% $output.uri %>"',
                         'echo "SECRET <% $secrets.api_key %> ROLE $PAI_CURRENT_TASK_ROLE_NAME $NNI_TRIAL_JOB_ID"',
                         f"{sys.executable} trial.py"]}},
    }
    data = config_dict(pai, base, {"reuseMode": True, "openpaiConfig": protocol})
    del data["trialCommand"]
    cfg = load_config(data)

    async def main() -> tuple[str, list[str]]:
        async with create_training_service(cfg) as ts:
            outs = []
            for i in range(2):  # two trials on one job: the rendered commands serve every trial of the role
                t = await ts.submit_trial_job(form(i, x=i, steps=1))
                await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
                (out,) = (ts.experiment_dir / "trials" / t.id).rglob("trial.stdout")
                outs.append((t.id, out.read_text()))
            assert len(ours(pai, ts.experiment_id)) == 1
            return ts.experiment_id, outs

    exp, outs = run(main())
    for trial_id, out in outs:
        lines = out.splitlines()
        assert "PARAMS resnet20 0.1" in lines, out
        assert "PREREQ bench https://data.example/cifar.tgz hdfs://out.example/models" in lines, out
        assert f"SECRET {secret} ROLE worker {trial_id}" in lines, out
    job = ours(pai, exp)[0]["detail"]
    assert secret not in json.dumps(job)  # PAI shows the job with its secrets masked
    assert_clean(pai, exp)


# ----------------------------------------------------------------------------- errors and faults

def test_unknown_virtual_cluster_fails_the_trial_with_pais_words(pai_factory, base: Path) -> None:
    pai = fast_pai(pai_factory)
    cfg = config(pai, base, {"virtualCluster": "nope", "reuseMode": False})

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "FAILED", timeout=T)
            assert "403" in d.message and "ForbiddenUserError" in d.message and "nope" in d.message, d.message
            assert pai.token not in d.message

    run(main())


def test_config_checked_at_start_and_errors_name_the_field(tmp_path: Path) -> None:
    base = {"trialCommand": "python3 t.py", "trialConcurrency": 1, "trialCodeDirectory": str(tmp_path),
            "trainingService": {"platform": "openpai", "host": "pai.example.com", "username": "u", "token": "t",
                                "trialMemorySize": "2gb"}}
    cfg = load_config(base)
    assert cfg.training_service.options.host == "https://pai.example.com"  # NNI adds https://
    assert "'t'" not in repr(cfg.training_service.options)

    def err(**ts: Any) -> str:
        data = json.loads(json.dumps(base))
        data["trainingService"].update(ts)
        for k in [k for k, v in ts.items() if v is None]:
            del data["trainingService"][k]
        with pytest.raises(ConfigError) as e:
            load_config(data)
        return str(e.value)

    assert "trainingService.token" in err(token=None)
    assert "trainingService.trialMemorySize" in err(trialMemorySize=None)
    assert "password" in err(passWord="x").lower()
    assert "openpaiConfig" in err(openpaiConfig={"taskRoles": {"bad-name": {"commands": ["x"]}}})
    assert "localStorageMountPoint" in err(localStorageMountPoint=str(tmp_path / "missing"))
    # v1: trainingServicePlatform pai, paiConfig and trial fields
    v1 = {"authorName": "a", "trialConcurrency": 1, "trainingServicePlatform": "pai",
          "paiConfig": {"userName": "u", "token": "t", "host": "10.1.1.1"},  # not dialed: data only
          "trial": {"command": "python3 t.py", "codeDir": str(tmp_path), "gpuNum": 1, "cpuNum": 2, "memoryMB": 4096,
                    "image": "img:1", "virtualCluster": "vcx"}}
    cfg = load_config(v1)
    o = cfg.training_service.options
    assert cfg.training_service.platform == "openpai"
    assert (o.host, o.username, o.cpus, o.memory_mb, o.gpus, o.docker_image, o.virtual_cluster) == (
        "https://10.1.1.1", "u", 2, 4096, 1, "img:1", "vcx")  # not dialed: data only


def test_dry_run_yaml_is_what_the_rest_server_accepts_and_holds_no_secret(tmp_path: Path) -> None:
    from tests.support.kube.emulator.crds import schemas_dir

    cfg = load_config({"trialCommand": "python3 t.py", "trialConcurrency": 2, "trialCodeDirectory": str(tmp_path),
                       "trainingService": {"platform": "openpai", "host": "pai.example.com", "username": "u",
                                           "token": "tok-SECRET-1", "trialMemorySize": "2gb",
                                           "storageConfigName": "confignfs", "virtualCluster": "vc1",
                                           "nniManagerIp": "10.0.0.5"}})  # not dialed: data only
    dry = backend_class("openpai")(cfg).render()
    assert "tok-SECRET-1" not in dry.text and "<masked>" in dry.text
    assert "secrets, masked here" in dry.text.splitlines()[0]
    job = dry.requests[0]
    schema = json.loads((schemas_dir() / "openpai" / "rest-server-protocol.schema.json").read_text())
    jsonschema.validate(job, schema)  # the rest-server's own validator accepts what we submit
    assert job["name"] == "nni_exp_dryrun_env_1" and job["defaults"]["virtualCluster"] == "vc1"
    assert job["extras"]["storages"] == [{"name": "confignfs"}]  # no mount point given: PAI's /mnt/confignfs
    commands = "\n".join(job["taskRoles"]["taskrole"]["commands"])
    assert "<% $secrets.nni_agent_token_taskrole_0 %>" in commands and "--token-file" in commands
    assert yaml.safe_load(dry.text.split("\n", 2)[2])["name"] == job["name"]


# ----------------------------------------------------------------------------- cleanup

def test_clean_up_stops_every_job_including_an_earlier_managers(pai_factory, base: Path) -> None:
    """A job of this experiment that nothing wants any more (left by an earlier manager) is
    stopped at start; clean_up stops the rest; no process is left."""
    pai = fast_pai(pai_factory)
    cfg = config(pai, base, {}, trialConcurrency=1, experimentName="clean")

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(sleeper(base, 0, "x"))
            await wait_status(ts, t.id, "RUNNING", timeout=T)
            assert pai.live_pids()
            return ts.experiment_id

    exp = run(main())
    assert_clean(pai, exp)
    assert os.environ.get("NNI_AGENT_TOKEN") is None


def test_agent_wheel_shipped_through_the_storage_when_mount_points_are_given(pai_factory, base: Path) -> None:
    """With storageConfigName and both mount points (NNI's shared storage), the manager copies its
    own agent wheel there and the job's agent runs from it (the trial gets only the trial API): an
    image needs only Python and the agent's dependencies. The emulator mounts the storage as PAI does (at the entry's `mountPath`,
    else /mnt/<name>), here at a path other than PAI's default."""
    pai = fast_pai(pai_factory)
    storage = pai.storage_dir("confignfs")  # the manager's own mount of the storage
    inside = "/mnt/nni-shared"  # where the job's containers see it (PAI's default: /mnt/confignfs)
    code = base / "code"
    code.mkdir(exist_ok=True)
    (code / "where.py").write_text("import nni_agent\nfrom nni_agent import get_next_parameter, report_final_result\n"
                                   "get_next_parameter()\nprint('AGENT', nni_agent.__file__, flush=True)\n"
                                   "report_final_result(1)\n")
    cfg = config(pai, base, {"storageConfigName": "confignfs", "localStorageMountPoint": str(storage),
                             "containerStorageMountPoint": inside}, trialCommand=f"{sys.executable} where.py")

    async def main() -> tuple[str, str]:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            out = (ts.experiment_dir / "trials" / t.id / "trial.stdout").read_text()
            return ts.experiment_id, out

    exp, out = run(main())
    wheels = list((storage / "nni-agent").glob("nni_agent-*.whl"))  # shared by experiments: named for its content
    assert len(wheels) == 1, wheels
    assert "/.trial-api-" in out.split("AGENT ", 1)[1].split("\n", 1)[0], out  # the trial: only the trial API
    job = next(j for j in ours(pai, exp))
    import urllib.request

    req = urllib.request.Request(f"{pai.api}/jobs/{pai.username}~{job['name']}/config",
                                 headers={"Authorization": f"Bearer {pai.token}"})
    commands = "\n".join(yaml.safe_load(urllib.request.urlopen(req, timeout=30).read())["taskRoles"]["taskrole"]
                         ["commands"])
    assert f"--wheel {inside}/nni-agent/{wheels[0].name} " in commands  # the agent: from the storage's wheel
    assert job["detail"]["jobStatus"]["virtualCluster"] == "default"
