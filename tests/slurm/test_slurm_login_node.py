"""`loginNode`: the manager drives the real 2-node Slurm cluster only through a real sshd on
127.0.0.1 (tests/support/slurm/fixtures.py `login_node`): every sbatch / squeue / scancel runs over SSH, the
job files go there by SFTP, and the agents reach the hub through the relay on the login node and
an SSH remote forward (TLS end to end). Also the dry run and config errors, without a cluster."""
from __future__ import annotations

import asyncio
import json
import re
import stat
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from nni_manager.backends.registry import backend_class
from nni_manager.config import ConfigError
from nni_manager.service import create_training_service
from tests.support.manager.helpers import form, release, sleeper, wait_status
from tests.support.slurm.fixtures import relay_processes
from tests.support.slurm.experiments import T, assert_clean, config, run


def login_config(base: Path, login: dict[str, Any], ts: dict[str, Any] | None = None, **top: Any):  # -> ExperimentConfig
    # no nniManagerIp: the hub listens on this manager's 127.0.0.1, reached only through the forward.
    # pythonPath: the compute nodes' Python for the agent (it gets the agent from the shipped wheel)
    cfg = config(base, {"loginNode": dict(login), "pythonPath": sys.executable, **(ts or {})}, **top)
    cfg.training_service.nni_manager_ip = None
    return cfg


def remote_exp_dir(login_node: Any, exp: str) -> Path:
    return login_node.home / "nni-experiments" / exp


def test_trial_metrics_cancel_and_cleanup_through_the_login_node(slurm, login_node, base: Path) -> None:
    cfg = login_config(base, login_node.spec, {"reuseMode": False}, trialConcurrency=2)
    metrics: dict[str, list[str]] = defaultdict(list)

    async def main() -> tuple[str, int, list[str]]:
        async with create_training_service(cfg) as ts:
            exp = ts.experiment_id
            ts.add_trial_job_metric_listener(lambda m: metrics[m.id].append(m.data))
            ok = await ts.submit_trial_job(form(0, x=7, steps=3))
            s1 = await ts.submit_trial_job(sleeper(base, 1, "s1"))
            await wait_status(ts, ok.id, "SUCCEEDED", timeout=T)
            got = [json.loads(m) for m in metrics[ok.id]]
            assert [(g["type"], g["sequence"], json.loads(g["value"])) for g in got] == [
                ("PERIODICAL", 0, 0), ("PERIODICAL", 1, 1), ("PERIODICAL", 2, 2), ("FINAL", 0, 7)], got

            # cancelled by us: USER_CANCELED, and its job goes
            await wait_status(ts, s1.id, "RUNNING", timeout=T)
            await ts.cancel_trial_job(s1.id)
            await wait_status(ts, s1.id, "USER_CANCELED", timeout=T)
            await asyncio.to_thread(slurm.wait_for, lambda: not slurm.live_jobs(f"nni_exp_{exp}_trial_{s1.id}"), 60,
                                    "the cancelled job to end")

            # the job files are on the login node (0700 dir, 0600 CA), none here
            job_dir = remote_exp_dir(login_node, exp) / "slurm" / f"nni_exp_{exp}_trial_{ok.id}"
            assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700
            assert stat.S_IMODE((job_dir / "ca.crt").stat().st_mode) == 0o600
            assert not (ts.experiment_dir / "slurm").exists()
            script = (job_dir / "batch.sh").read_text()
            # the agents dial the relay on the login node, not the hub
            dial = re.search(r"--manager (\S+)", script)
            assert dial, script
            hub_port = int(ts.trials.store.setting("hub_address").rpartition(":")[2])
            relay_host, _, relay_port = dial[1].rpartition(":")
            assert relay_host == "127.0.0.1" and int(relay_port) != hub_port, (dial[1], hub_port)
            assert f"{remote_exp_dir(login_node, exp)}/agent-wheel/nni_agent-" in script
            assert not any(a["token"] in script for a in ts.trials.store.agents())
            assert relay_processes(), "a relay runs on the login node"
            # trialConcurrency raised from the WebUI: the running relay's bound follows (it reads relay.limit)
            limit = remote_exp_dir(login_node, exp) / "relay.limit"
            assert limit.read_text() == "256\n"  # 2 jobs of 1 node: the floor
            await ts.set_trial_concurrency(200)  # what the WebUI's TRIAL_CONCURRENCY update calls
            assert limit.read_text() == f"{2 * 200 + 64}\n"  # every agent's connection twice over, and room
            return exp, int(relay_port), [a["token"] for a in ts.trials.store.agents()]

    exp, relay_port, tokens = run(main())
    # every agent connection went through the relay, into the forward
    relay_log = (remote_exp_dir(login_node, exp) / "relay.log").read_text()
    assert f"relay on 127.0.0.1:{relay_port}" in relay_log, relay_log
    assert len(re.findall(r"piped to 127\.0\.0\.1:\d+", relay_log)) >= 2, relay_log
    assert_clean(slurm, exp)
    slurm.wait_for(lambda: not relay_processes(), 30, "the relay to stop")
    left = [f for f in (remote_exp_dir(login_node, exp) / "slurm").rglob("*") if f.is_file()]
    assert left and not any(tok in f.read_text(errors="replace") for f in left for tok in tokens), left
    assert not list((remote_exp_dir(login_node, exp) / "slurm").rglob("*.token"))


def test_two_node_trial_through_the_login_node(slurm, login_node, base: Path) -> None:
    cfg = login_config(base, login_node.spec, {"nodes": 2, "reuseMode": False},
                       trialCommand=f"{sys.executable} seen.py")

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
    assert {v["SLURMD_NODENAME"] for v in views.values()} == {"n1", "n2"}, views
    assert {v["SLURM_PROCID"] for v in views.values()} == {"0", "1"}
    assert len({v["SLURM_JOB_ID"] for v in views.values()}) == 1
    # the agent came from the wheel shipped to the login node by SFTP (its batch script: see above);
    # the trials get only its stdlib trial API, never the agent's path (nni_agent.trial_path)
    assert all("/.trial-api-" in v["agent"] for v in views.values()), views
    assert_clean(slurm, exp)
    assert not relay_processes()


def _remote_logs(login_node: Any, exp: str) -> str:
    """The tails of the relay's and the agents' logs in the experiment's directory on the login node."""
    root = remote_exp_dir(login_node, exp)
    logs = [root / "relay.log", *sorted(root.rglob("agent-*.log"))]
    return "\n".join(f"--- {p}:\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
                     for p in logs if p.is_file())


def test_reuse_through_the_login_node_survives_a_dropped_ssh_link(slurm, login_node, base: Path) -> None:
    """reuse mode over loginNode; the SSH link to the login node drops while two trials run: the
    backend reconnects, re-opens the forward and points the (still running) relay at it; the agents
    redial the same relay address and their trials finish; the allocations serve more trials."""
    cfg = login_config(base, login_node.spec, trialConcurrency=2)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            exp = ts.experiment_id
            a = await ts.submit_trial_job(sleeper(base, 0, "a"))
            b = await ts.submit_trial_job(sleeper(base, 1, "b"))
            await wait_status(ts, a.id, "RUNNING", timeout=T)
            await wait_status(ts, b.id, "RUNNING", timeout=T)
            relays = relay_processes()
            relay_log = remote_exp_dir(login_node, exp) / "relay.log"
            piped = relay_log.read_text().count("piped to")
            target = (remote_exp_dir(login_node, exp) / "relay.target").read_text()
            assert login_node.kill_connections() >= 1
            await asyncio.to_thread(  # (in a thread: the manager's event loop keeps running)
                slurm.wait_for, lambda: (remote_exp_dir(login_node, exp) / "relay.target").read_text() != target, 60,
                "the relay to be pointed at a new forward")
            release(base, "a")
            release(base, "b")
            try:
                for t in (a, b):
                    await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            except AssertionError as e:  # what the relay and the agents saw, for the next look
                raise AssertionError(f"{e}\n{_remote_logs(login_node, exp)}") from None
            assert relay_log.read_text().count("piped to") >= piped + 2  # both agents redialled through the relay
            more = [await ts.submit_trial_job(form(i, x=i, steps=1)) for i in range(2, 6)]
            for t in more:
                d = await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
                assert d.environment_id in ("env1", "env2"), d
            assert relay_processes() == relays  # the same relay throughout: the agents' address never changed
            names = sorted(j["name"] for j in slurm.jobs(f"nni_exp_{exp}_"))
            assert names == [f"nni_exp_{exp}_env_1", f"nni_exp_{exp}_env_2"], names
            return exp

    exp = run(main())
    assert_clean(slurm, exp)
    slurm.wait_for(lambda: not relay_processes(), 30, "the relay to stop")


def test_unknown_login_node_host_key_fails_at_start(slurm, login_node, base: Path) -> None:
    empty = base / "known_hosts"
    empty.write_text("")
    cfg = login_config(base, {**login_node.spec, "knownHostsFile": str(empty)})

    async def main() -> None:
        async with create_training_service(cfg):
            pass

    with pytest.raises(Exception) as err:
        run(main())
    assert "host key is not known" in str(err.value) and "loginNode" in str(err.value), err.value
    assert not relay_processes()


# ----------------------------------------------------------------------------- without a cluster

def test_dry_run_says_where_commands_run(tmp_path: Path) -> None:
    key = tmp_path / "id"
    key.write_text("not read by the dry run")
    cfg = config(tmp_path, {"loginNode": {"host": "login.hpc.example", "user": "alice", "sshKeyFile": str(key),
                                          "relayHost": "login01", "relayPort": 8999}})
    backend = backend_class("slurm")(cfg)
    text = str(backend.render())
    for needle in ("on login node alice@login.hpc.example:22 over SSH", "host key checked against",
                   "by SFTP", "--manager login01:8999", "relay login01:8999", "sbatch --test-only",
                   "cd '<$HOME on the login node>/nni-experiments/dryrun/slurm/nni_exp_dryrun_env_1' && sbatch --parsable",
                   "for c in python3; do", "agent-wheel/nni_agent-"):
        assert needle in text, (needle, text)
    assert backend.render().requests[0]["runs_on"] == "alice@login.hpc.example:22"
    assert backend.hub_names() == ["login01"]  # the hub's certificate names what the agents dial


def test_hub_certificate_names_the_relay(tmp_path: Path) -> None:
    """hub_setup asks the backend for extra names: the certificate the agents verify carries relayHost."""
    from cryptography import x509

    from nni_manager.service import hub_setup
    from nni_manager.store import Store

    key = tmp_path / "id"
    key.write_text("")
    cfg = config(tmp_path, {"loginNode": {"host": "login.hpc.example", "user": "alice", "sshKeyFile": str(key),
                                          "relayHost": "login01.cluster"}})
    cfg.training_service.nni_manager_ip = None
    backend = backend_class("slurm")(cfg)
    exp_dir = tmp_path / "exp"
    exp_dir.mkdir()
    store = Store.open(exp_dir)
    try:
        listen, tls = asyncio.run(hub_setup.listen_address(backend, store, exp_dir, "e1"))
    finally:
        store.close()
    assert listen.startswith("127.0.0.1:"), listen  # only the SSH forward reaches the hub
    cert = x509.load_pem_x509_certificate(tls.certificate)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "login01.cluster" in names, names


@pytest.mark.parametrize("login,problem", [
    ({"user": "alice"}, "loginNode.host"),
    ({"host": "h", "user": "a", "relayPort": 70000}, "loginNode.relayPort"),
    ({"host": "h", "user": "a", "sshKeyFile": "/nonexistent/key"}, "loginNode.sshKeyFile"),
    ({"host": "h", "user": "a", "gpuIndices": [0]}, "loginNode.gpuIndices"),
])
def test_login_node_config_errors_name_the_field(tmp_path: Path, login: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        config(tmp_path, {"loginNode": login})
    assert problem in str(err.value), str(err.value)
