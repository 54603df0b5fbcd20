"""Each job platform as the contract suite (tests/platforms/test_job_contract.py) drives it: the
fixture that runs its emulator or cluster, an experiment config in the platform's usual form, its
jobs' states in its own words, and how to make a job whose agent never dials the hub.

The suite's scenarios are the ones every platform built on backends/jobs.py must pass; what only
one platform does stays in that platform's folder. A new platform joins by subclassing
`JobPlatform` and adding an instance to `PLATFORMS`; where its jobs are named otherwise than
jobs.py's `nni_exp_<id>_...` it says so in `job_prefix` and `job_of` (the Kubernetes platforms)."""
from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.support.manager.helpers import TRIAL
from tests.support.bounded import run_bounded

STUCK_IMAGE = "stuck/image:1"
BARE_IMAGE = "bare/python:3"
T = 90.0  # the scenarios' polling timeout: generous, two cores shared with other test runs


def run(coro: Any) -> Any:
    """A scenario's body, bounded: a hung one fails instead of holding the run."""
    return run_bounded(coro, 240)


def _code(base: Path) -> Path:
    code = base / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    return code


def _stuck_bin(base: Path) -> str:
    """An image's bin dir whose `python3` never starts the agent (it sleeps)."""
    stuck = base / "stuck-bin"
    stuck.mkdir(exist_ok=True)
    (stuck / "python3").write_text("#!/bin/sh\nexec sleep 600\n")
    (stuck / "python3").chmod(0o755)
    return str(stuck)


def placeholders(env: Any) -> Any:
    """`env` with the dry run's placeholder token and CA (backends/base.py `dry_run_env`)."""
    import dataclasses

    from nni_manager.backends.base import DRY_RUN_CA, DRY_RUN_TOKEN

    return dataclasses.replace(env, members=tuple(
        dataclasses.replace(m, token=DRY_RUN_TOKEN, ca_certificate=DRY_RUN_CA if m.ca_certificate else b"")
        for m in env.members))


def literals_as_placeholders(command: str, env: Any) -> str:
    """A job's command as submitted by a platform with no secret store (its agent's single-use
    token and the experiment's CA written as literals: rest_jobs.py `literal_secret_lines`), with
    the dry run's placeholders in their place. The token was spent at enrolment (the environment
    now holds the session's), so it is found by its line; there is exactly one."""
    import shlex

    from nni_manager.backends.base import DRY_RUN_CA, DRY_RUN_TOKEN

    lines = command.splitlines()
    token_lines = [i for i, line in enumerate(lines) if line.endswith('> "$NNI_AGENT_DIR/token"')]
    assert len(token_lines) == 1 and DRY_RUN_TOKEN not in command, token_lines
    lines[token_lines[0]] = f'printf "%s" {shlex.quote(DRY_RUN_TOKEN)} > "$NNI_AGENT_DIR/token"'
    command = "\n".join(lines)
    ca = env.members[0].ca_certificate
    if ca:
        literal = shlex.quote(ca.decode().strip())
        assert literal in command
        command = command.replace(literal, shlex.quote(DRY_RUN_CA.decode()))
    return command


class JobPlatform:
    """What a scenario needs of one platform. `emu` below is what the platform's fixture gives."""

    name: ClassVar[str]
    fixture: ClassVar[str]  # a running emulator / cluster that scenarios may share (they find their jobs by name)
    group: ClassVar[str | None] = None  # the fixture's xdist group (tests/support/parallel.py ONE_WORKER)
    tag: ClassVar[str]  # experiment ids the scenarios name themselves: f"{tag}Restart1"
    reuse: ClassVar[bool]  # in the config below: one job per environment (env_<n>) or one per trial
    running_state: ClassVar[str]  # a running job's state in the platform's listing
    stopped_state: ClassVar[str]  # the state of a job the manager stopped
    ended_states: ClassVar[tuple[str, ...]]  # the states of a job that ended, however
    clean_states: ClassVar[tuple[str, ...]]  # the states clean_up leaves the experiment's jobs in
    not_dialled_words: ClassVar[tuple[str, ...]] = ()  # the platform's own words while an agent has not dialled
    stuck_pool: ClassVar[bool] = False  # `stuck` runs a pool: environments are tried until one starts, not one job
    pool_only: ClassVar[bool] = False  # trials always run on a pool's jobs (no job of a trial's own)
    failed_state: ClassVar[str] = ""  # the state of a trial's own job whose trial failed
    fault_statuses: ClassVar[tuple[int, ...]] = ()  # what `inject_faults` makes the platform's API answer

    def job_prefix(self, experiment_id: str) -> str:
        """What the names of an experiment's jobs start with (backends/jobs.py `prefix`)."""
        return f"nni_exp_{experiment_id}_"

    def param(self) -> Any:
        marks = [pytest.mark.xdist_group(self.group)] if self.group else []
        return pytest.param(self, id=self.name, marks=marks)

    def emulator(self, request: pytest.FixtureRequest) -> Any:
        return request.getfixturevalue(self.fixture)

    def config(self, emu: Any, base: Path, **ts: Any) -> dict[str, Any]:
        """An experiment running tests.support.manager.helpers.TRIAL from base/code, two trials at a
        time, its directory under base/exps; `ts`: training service fields."""
        raise NotImplementedError

    def stuck(self, request: pytest.FixtureRequest, base: Path, timeout: str) -> tuple[Any, dict[str, Any]]:
        """An emulator / cluster and a one-trial-per-job config whose job runs but never starts its
        agent, with `agentConnectTimeout: timeout`."""
        raise NotImplementedError

    def states(self, emu: Any, prefix: str) -> dict[str, str]:
        """Job name -> state, for every job whose name starts with `prefix`."""
        raise NotImplementedError

    def cancel_outside(self, emu: Any, name: str) -> list[str]:
        """Stop job `name` as someone else would, with the platform's own tools (not the manager's
        client); returns the words the trial's message must then hold (the platform's)."""
        raise NotImplementedError

    def processes(self, emu: Any) -> list[int]:
        """The processes the platform's jobs still run."""
        raise NotImplementedError

    def secrets(self, emu: Any) -> list[str]:
        """Credentials of the platform that must never reach the manager's output."""
        return []

    def wait_for(self, emu: Any, predicate: Any, timeout: float, what: str) -> Any:
        return emu.wait_for(predicate, timeout, what=what)

    def canceled_states(self) -> tuple[str, ...]:
        """The states a trial's own job ends in once the user cancelled the trial."""
        return (self.stopped_state,)

    def trial_config(self, emu: Any, base: Path, **ts: Any) -> dict[str, Any]:
        """`config` with one job per trial, one trial at a time; a pool of one job where the
        platform has pools only (`pool_only`)."""
        data = self.config(emu, base, **({"reuseMode": False} if self.reuse and not self.pool_only else {}), **ts)
        data["trialConcurrency"] = 1
        return data

    def wrong_credentials(self, request: pytest.FixtureRequest,
                          base: Path) -> tuple[dict[str, Any], tuple[str, ...], str | None]:
        """A config whose credentials the platform refuses (its emulator running), the words the
        refusal at start must hold (the platform's reason, the field or role to fix), and the
        refused secret, which it must not (None: a login's, not in the config)."""
        pytest.skip(f"{self.name} has no credentials of its own to refuse (its commands run as the user)")

    def waiting(self, request: pytest.FixtureRequest, base: Path) -> tuple[Any, dict[str, Any], int, tuple[str, ...]]:
        """An emulator or cluster, a config (one job per trial where the platform has it), how many
        running trials fill the room, and the platform's words while the next trial's job waits."""
        pytest.skip(f"{self.name}'s emulator has no queue: its jobs never wait for room")

    def let_waiting_run(self, emu: Any) -> None:
        """Let a waiting job go, beyond the running trials ending (a queue's hold)."""

    def fault_emulator(self, request: pytest.FixtureRequest) -> Any:
        """An emulator of this test's own, whose API `inject_faults` may break."""
        pytest.skip(f"{self.name} has no REST API to fail")

    def inject_faults(self, emu: Any) -> None:
        """Make the platform's API fail for a few seconds (errors, hangs), as it does on a bad day;
        returns when the faults are over (`clear_faults` then ends any left)."""
        raise NotImplementedError

    def fail_submissions(self, emu: Any, count: int) -> None:
        """The next `count` requests that create a job are answered with a server error (5xx) and
        create nothing."""
        raise NotImplementedError

    def clear_faults(self, emu: Any) -> None:
        emu.clear_faults()

    def fault_words(self) -> tuple[str, ...]:
        """What the manager's log says of a fault it retries (one of these)."""
        return tuple(str(s) for s in self.fault_statuses)

    def dry_run_built(self, backend: Any) -> tuple[Any, Any]:
        """(the requests the dry run shows, what `build_request` makes of the dry run's environment):
        the dry run goes through the builder `provision` uses. An SDK's request model (DLC's) is
        compared as the body it sends."""
        def plain(r: Any) -> Any:
            return r.to_map() if hasattr(r, "to_map") else r

        return [plain(r) for r in backend.render().requests], [plain(backend.build_request(backend.dry_run_env()))]

    boot_line_in_message: ClassVar[bool] = True  # the platform hands the boot step's line to the trial's message

    def bare_image(self, request: pytest.FixtureRequest, base: Path, bare: Path) -> tuple[Any, dict[str, Any]]:
        """An emulator whose image BARE_IMAGE runs the Python in `bare` (no agent, no dependencies),
        and a config whose one trial at a time runs in it, where the platform has no way to ship them."""
        pytest.skip(f"{self.name} ships the agent's dependencies to a bare image (its own folder's tests)")

    def job_logs(self, emu: Any) -> list[str] | None:
        """The non-empty logs of the platform's jobs (stderr), where the emulator keeps them."""
        return [t for p in (emu.state / "tasks").glob("*/stderr") if (t := p.read_text()).strip()]

    def held_request(self, emu: Any, backend: Any, env: Any) -> tuple[Any, Any]:
        """(what the platform holds for `env`'s job, read with its own API or tools; what
        `backend.build_request` makes of `env` with the dry run's placeholders put back where
        only `start` knows the value), both in the platform's form, to be equal."""
        raise NotImplementedError

    def answered_statuses(self, emu: Any) -> set[int]:
        """The HTTP statuses the platform's API answered the manager with."""
        return {r["status"] for r in emu.requests()}

    # derived
    def job_of(self, prefix: str, trial_id: str, environment_id: str) -> str:
        """The name of the job running a trial: its environment's in a pool, else the trial's own."""
        if environment_id.startswith("env"):
            return f"{prefix}env_{environment_id.removeprefix('env')}"
        return f"{prefix}trial_{trial_id}"

    def running(self, emu: Any, prefix: str) -> list[str]:
        return sorted(n for n, s in self.states(emu, prefix).items() if s == self.running_state)

    def live(self, emu: Any, prefix: str) -> list[str]:
        return sorted(n for n, s in self.states(emu, prefix).items() if s not in self.ended_states)

    def wait_clean(self, emu: Any, prefix: str) -> None:
        """Every job of the experiment ended as clean_up ends them, and no process of any job is left."""
        self.wait_for(emu, lambda: not self.live(emu, prefix), 60, "every job of the experiment ended")
        states = self.states(emu, prefix)
        assert states and set(states.values()) <= set(self.clean_states), states
        self.wait_for(emu, lambda: not self.processes(emu), 60, "no job process left")


class OpenPai(JobPlatform):
    name, fixture, tag, reuse = "openpai", "pai_factory", "Pai", True
    running_state, stopped_state, ended_states = "RUNNING", "STOPPED", ("STOPPED", "SUCCEEDED", "FAILED")
    clean_states = ("STOPPED", "SUCCEEDED")  # succeeded: its agents were told to stop before PAI's STOP landed
    failed_state, fault_statuses = "FAILED", (500,)

    def emulator(self, request: pytest.FixtureRequest) -> Any:
        return request.getfixturevalue("pai_factory")(rate_limits={"list": 0})  # the real one: 60 listings a minute

    def config(self, emu: Any, base: Path, **ts: Any) -> dict[str, Any]:
        return {"trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(_code(base)),
                "trialConcurrency": 2, "trialGracePeriod": 2, "experimentWorkingDirectory": str(base / "exps"),
                "trainingService": {"platform": "openpai", "host": emu.url, "username": emu.username,
                                    "token": emu.token, "nniManagerIp": "127.0.0.1", "trialMemorySize": "1gb",
                                    "pollInterval": "0.5s", **ts}}

    def stuck(self, request: pytest.FixtureRequest, base: Path, timeout: str) -> tuple[Any, dict[str, Any]]:
        pai = request.getfixturevalue("pai_factory")(rate_limits={"list": 0}, images={STUCK_IMAGE: _stuck_bin(base)})
        return pai, self.config(pai, base, reuseMode=False, dockerImage=STUCK_IMAGE, agentConnectTimeout=timeout)

    def states(self, emu: Any, prefix: str) -> dict[str, str]:
        return {j["name"]: j["state"] for j in emu.jobs() if j["name"].startswith(prefix)}

    def bare_image(self, request: pytest.FixtureRequest, base: Path, bare: Path) -> tuple[Any, dict[str, Any]]:
        """No storage the manager can write (its route to PAI's shared storage): nothing to ship through
        (tests/openpai/test_openpai_shipped_deps.py ships them where there is one)."""
        pai = request.getfixturevalue("pai_factory")(rate_limits={"list": 0}, images={BARE_IMAGE: str(bare)})
        data = self.config(pai, base, reuseMode=False, dockerImage=BARE_IMAGE)
        data["trialConcurrency"] = 1
        return pai, data

    def job_logs(self, emu: Any) -> list[str] | None:
        return None  # the trial's message holds the line (PAI's exit diagnostics)

    def processes(self, emu: Any) -> list[int]:
        return emu.live_pids()

    def cancel_outside(self, emu: Any, name: str) -> list[str]:
        """`PUT jobs/{user}~{name}/executionType {value: STOP}`, as PAI's web portal does."""
        req = urllib.request.Request(f"{emu.api}/jobs/{emu.username}~{name}/executionType", method="PUT",
                                     data=json.dumps({"value": "STOP"}).encode(),
                                     headers={"Authorization": f"Bearer {emu.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 202, r.read()
        return ["outside this experiment", "STOP"]

    def secrets(self, emu: Any) -> list[str]:
        return [emu.token]

    def wrong_credentials(self, request: pytest.FixtureRequest,
                          base: Path) -> tuple[dict[str, Any], tuple[str, ...], str | None]:
        return (self.config(self.emulator(request), base, token="not-the-token-4242"),
                ("401", "UnauthorizedUserError", "trainingService.token"), "not-the-token-4242")

    def fault_emulator(self, request: pytest.FixtureRequest) -> Any:
        return self.emulator(request)  # already one of the test's own

    def inject_faults(self, emu: Any) -> None:
        """500s, then hangs, then reset connections, each for a while (PAI's rest-server behind pylon)."""
        import time

        emu.fault("error", status=500, seconds=3)
        time.sleep(3.5)
        emu.fault("hang", seconds=2, hang_seconds=5)
        time.sleep(2.5)
        emu.fault("reset", seconds=2)
        time.sleep(2.5)

    def fail_submissions(self, emu: Any, count: int) -> None:
        emu.fault("error", status=500, count=count, method="POST", path=r"/jobs$")

    def held_request(self, emu: Any, backend: Any, env: Any) -> tuple[Any, Any]:
        """The job config PAI serves (`GET jobs/{user}~{name}/config`), secrets masked as PAI masks
        them: PAI never gives the tokens back."""
        import yaml

        built = backend.build_request(env)
        assert built["secrets"]
        req = urllib.request.Request(f"{emu.api}/jobs/{emu.username}~{built['name']}/config",
                                     headers={"Authorization": f"Bearer {emu.token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            held = yaml.safe_load(r.read())
        return held, {**built, "secrets": "******"}

    def waiting(self, request: pytest.FixtureRequest, base: Path) -> tuple[Any, dict[str, Any], int, tuple[str, ...]]:
        pai = self.emulator(request)  # the emulator's vc2 has room for one task
        return pai, self.config(pai, base, reuseMode=False, virtualCluster="vc2"), 1, (
            "WAITING", "virtual cluster vc2", "may be full")


class Dlts(JobPlatform):
    """NNI's v1 config (nnictl YAML) unchanged; DLTS runs one job per trial."""

    name, fixture, tag, reuse = "dlts", "dlts_in_shared", "Dlts", False
    running_state, stopped_state, ended_states = "running", "killed", ("finished", "failed", "killed", "paused")
    clean_states = ("finished", "killed")
    failed_state, fault_statuses = "failed", (503,)

    def config(self, emu: Any, base: Path, **ts: Any) -> dict[str, Any]:
        return {"authorName": "nni", "experimentName": "dlts", "trialConcurrency": 2, "maxExecDuration": "1h",
                "trainingServicePlatform": "dlts", "nniManagerIp": "127.0.0.1", "logDir": str(base / "exps"),
                "searchSpace": {"x": {"_type": "choice", "_value": [1]}}, "tuner": {"builtinTunerName": "Random"},
                "trial": {"command": f"{sys.executable} trial.py", "codeDir": str(_code(base)), "gpuNum": 0,
                          "image": "msranni/nni"},
                "dltsConfig": {**emu.dlts_config(), "pollInterval": "0.3s", **ts}}

    def stuck(self, request: pytest.FixtureRequest, base: Path, timeout: str) -> tuple[Any, dict[str, Any]]:
        dlts = request.getfixturevalue("dlts_factory")(
            images={STUCK_IMAGE: _stuck_bin(base), "*": str(Path(sys.executable).parent)})
        data = self.config(dlts, base, agentConnectTimeout=timeout)
        data["trial"]["image"] = STUCK_IMAGE
        return dlts, data

    def states(self, emu: Any, prefix: str) -> dict[str, str]:
        return {j["jobName"]: j["jobStatus"] for j in emu.jobs() if j["jobName"].startswith(prefix)}

    def bare_image(self, request: pytest.FixtureRequest, base: Path, bare: Path) -> tuple[Any, dict[str, Any]]:
        """DLTS has no channel to ship anything: the boot step (inline in `cmd`) ends the job, its line in
        the pod's /dev/termination-log, which DLTS shows in the job's status detail."""
        import os

        if os.geteuid() != 0:
            pytest.skip("the emulator gives a job its own /dev/termination-log in a mount namespace (root only)")
        dlts = request.getfixturevalue("dlts_factory")(images={BARE_IMAGE: str(bare)})
        data = self.config(dlts, base)
        data["trial"]["image"], data["trialConcurrency"] = BARE_IMAGE, 1
        return dlts, data

    def cancel_outside(self, emu: Any, name: str) -> list[str]:
        """The job goes `killing`, as when its owner or an administrator kills it in the dashboard."""
        emu.force_status(next(j["jobId"] for j in emu.jobs() if j["jobName"] == name), "killing")
        return ["killed outside this experiment"]

    def processes(self, emu: Any) -> list[int]:
        return emu.live_pids()

    def secrets(self, emu: Any) -> list[str]:
        return [emu.password()]

    def wrong_credentials(self, request: pytest.FixtureRequest,
                          base: Path) -> tuple[dict[str, Any], tuple[str, ...], str | None]:
        return self.config(self.emulator(request), base, password="0" * 32), ("403", "Invalid token"), "0" * 32

    def fault_emulator(self, request: pytest.FixtureRequest) -> Any:
        return request.getfixturevalue("dlts_factory")()

    def inject_faults(self, emu: Any) -> None:
        """503s from the dashboard, then requests that hang."""
        import time

        emu.fault(503, count=20)
        time.sleep(2)
        emu.fault(None, count=3, hang=4)
        time.sleep(3)

    def fail_submissions(self, emu: Any, count: int) -> None:
        emu.fault(503, count=count, method="POST", path=r"/jobs$")

    def waiting(self, request: pytest.FixtureRequest, base: Path) -> tuple[Any, dict[str, Any], int, tuple[str, ...]]:
        dlts = self.emulator(request)
        dlts.hold("queued")  # the cluster's scheduler finds no room (dlts_in_shared lets go afterwards)
        return dlts, self.config(dlts, base), 0, ("queued", "waiting for available resource")

    def let_waiting_run(self, emu: Any) -> None:
        emu.hold(None)

    def held_request(self, emu: Any, backend: Any, env: Any) -> tuple[Any, Any]:
        """The job's parameters as the dashboard keeps them, which fills in the paths NNI leaves
        empty and parses the preemption flag (as DLTS' RestAPI does)."""
        built = backend.build_request(placeholders(env))
        (job,) = [j for j in emu.jobs() if j["jobName"] == built["jobName"]]
        held = dict(job["jobParams"])
        held["cmd"] = literals_as_placeholders(held["cmd"], env)
        assert built["workPath"] == built["jobPath"] == ""
        assert str(held["preemptionAllowed"]) == built["preemptionAllowed"]
        assigned = {"workPath", "jobPath", "preemptionAllowed"}
        return ({k: v for k, v in held.items() if k in built and k not in assigned},
                {k: v for k, v in built.items() if k not in assigned})


class Aml(JobPlatform):
    """Logged in through the Azure CLI as the emulator's Contributor; AML runs a pool (reuse only)."""

    name, fixture, tag, reuse = "aml", "aml_in_shared", "Aml", True
    running_state, stopped_state, ended_states = "Running", "Canceled", ("Canceled", "Completed", "Failed")
    clean_states, stuck_pool, pool_only = ended_states, True, True
    fault_statuses = (429, 503)

    def config(self, emu: Any, base: Path, **ts: Any) -> dict[str, Any]:
        return {"trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(_code(base)),
                "trialConcurrency": 2, "experimentWorkingDirectory": str(base / "exps"), "trialGracePeriod": 2,
                "trainingService": {**emu.aml_config(), "nniManagerIp": "127.0.0.1", "pollInterval": "0.3s", **ts}}

    def stuck(self, request: pytest.FixtureRequest, base: Path, timeout: str) -> tuple[Any, dict[str, Any]]:
        from tests.support.aml.fixtures import logged_in

        aml = logged_in(request.getfixturevalue("aml_factory")(images={STUCK_IMAGE: _stuck_bin(base)}),
                        request.getfixturevalue("monkeypatch"))
        data = self.config(aml, base, dockerImage=STUCK_IMAGE, agentConnectTimeout=timeout)
        data["trialConcurrency"] = 1
        return aml, data

    boot_line_in_message = False  # the job's log (user_logs/std_log.txt) holds it: the message points there

    def states(self, emu: Any, prefix: str) -> dict[str, str]:
        return {j["name"]: j["status"] for j in emu.jobs() if j["name"].startswith(prefix)}

    def bare_image(self, request: pytest.FixtureRequest, base: Path, bare: Path) -> tuple[Any, dict[str, Any]]:
        """No code asset (its datastore: tests/aml/test_aml_code_asset.py ships them through one)."""
        from tests.support.aml.fixtures import logged_in

        aml = logged_in(request.getfixturevalue("aml_factory")(images={BARE_IMAGE: str(bare)}),
                        request.getfixturevalue("monkeypatch"))
        data = self.config(aml, base, dockerImage=BARE_IMAGE)
        data["trialConcurrency"] = 1
        return aml, data

    @staticmethod
    def _as_user(emu: Any, method: str, path: str) -> tuple[int, bytes]:
        """(status, body) of `method` on the workspace's `path` with the logged-in user's ARM token."""
        import ssl

        from azure.identity import DefaultAzureCredential

        token = DefaultAzureCredential().get_token("https://management.azure.com/.default").token
        req = urllib.request.Request(f"{emu.url}{emu.workspace_path}{path}?api-version=2024-04-01", method=method,
                                     data=b"" if method == "POST" else None,
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=30, context=ssl.create_default_context(cafile=emu.ca_file)) as r:
            return r.status, r.read()

    def cancel_outside(self, emu: Any, name: str) -> list[str]:
        """`POST .../jobs/{name}/cancel` with the logged-in user's ARM token, as the studio does."""
        status, body = self._as_user(emu, "POST", f"/jobs/{name}/cancel")
        assert status == 202, body
        return ["outside this experiment"]

    def processes(self, emu: Any) -> list[int]:
        return emu.live_pids()

    def wrong_credentials(self, request: pytest.FixtureRequest,
                          base: Path) -> tuple[dict[str, Any], tuple[str, ...], str | None]:
        """Logged in as a Reader, who may look but not create environments."""
        aml = self.emulator(request)
        monkeypatch = request.getfixturevalue("monkeypatch")
        for k, v in aml.env("reader").items():
            monkeypatch.setenv(k, v)
        return self.config(aml, base), ("403", "AuthorizationFailed", "AzureML Data Scientist"), None

    def fault_emulator(self, request: pytest.FixtureRequest) -> Any:
        from tests.support.aml.fixtures import logged_in

        return logged_in(request.getfixturevalue("aml_factory")(), request.getfixturevalue("monkeypatch"))

    def inject_faults(self, emu: Any) -> None:
        """ARM throttles four requests (Retry-After honoured), then errors on four more."""
        for status in (429, 503):
            emu.fault(status, count=4)
            emu.wait_for(lambda s=status: [r["status"] for r in emu.requests()].count(s) == 4, 60,
                         what=f"four requests answered {status}")

    def fail_submissions(self, emu: Any, count: int) -> None:
        emu.fault(503, count=count, method="PUT", path=r"/jobs/nni_exp_")

    def waiting(self, request: pytest.FixtureRequest, base: Path) -> tuple[Any, dict[str, Any], int, tuple[str, ...]]:
        aml = self.emulator(request)
        aml.hold("Queued")  # the compute cluster has no free node (aml_in_shared lets go afterwards)
        return aml, self.config(aml, base), 0, ("Queued",)

    def let_waiting_run(self, emu: Any) -> None:
        emu.hold(None)

    def held_request(self, emu: Any, backend: Any, env: Any) -> tuple[Any, Any]:
        """The job as ARM serves it to the logged-in user (`GET .../jobs/{name}`): the request's
        properties, among those the service adds (status, services, ...)."""
        built = backend.build_request(placeholders(env))
        _, body = self._as_user(emu, "GET", f"/jobs/{built['properties']['displayName']}")
        props = json.loads(body)["properties"]
        held = {k: props.get(k) for k in built["properties"]}
        held["command"] = literals_as_placeholders(held["command"], env)
        return {"properties": held}, built


class Dlc(JobPlatform):
    """NNI's config_dlc.yml fields, the official SDK signing with the AccessKey; DLC runs a pool (reuse only)."""

    name, fixture, tag, reuse = "dlc", "dlc_in_shared", "Dlc", True
    running_state, stopped_state, ended_states = "Running", "Stopped", ("Stopped", "Succeeded", "Failed")
    clean_states, stuck_pool, pool_only = ("Stopped", "Succeeded"), True, True
    fault_statuses = (500, 503)

    def config(self, emu: Any, base: Path, **ts: Any) -> dict[str, Any]:
        return {"trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(_code(base)),
                "trialConcurrency": 2, "trialGracePeriod": 2, "experimentWorkingDirectory": str(base / "exps"),
                "nniManagerIp": "127.0.0.1", "trainingService": emu.training_service(**ts)}

    def stuck(self, request: pytest.FixtureRequest, base: Path, timeout: str) -> tuple[Any, dict[str, Any]]:
        dlc = request.getfixturevalue("dlc_factory")(images={STUCK_IMAGE: _stuck_bin(base)})
        data = self.config(dlc, base, image=STUCK_IMAGE, agentConnectTimeout=timeout)
        data["trialConcurrency"] = 1
        return dlc, data

    def states(self, emu: Any, prefix: str) -> dict[str, str]:
        return {j["DisplayName"]: j["Status"] for j in emu.jobs() if j["DisplayName"].startswith(prefix)}

    def bare_image(self, request: pytest.FixtureRequest, base: Path, bare: Path) -> tuple[Any, dict[str, Any]]:
        """DLC's jobs get nothing from the manager but their command."""
        dlc = request.getfixturevalue("dlc_factory")(images={BARE_IMAGE: str(bare)})
        data = self.config(dlc, base, image=BARE_IMAGE)
        data["trialConcurrency"] = 1
        return dlc, data

    @staticmethod
    def _as_user(emu: Any) -> tuple[Any, Any]:
        """(the official SDK's client signing with the user's AccessKey, its RuntimeOptions)."""
        from alibabacloud_pai_dlc20201203.client import Client
        from alibabacloud_tea_openapi.models import Config
        from darabonba.runtime import RuntimeOptions

        return (Client(Config(access_key_id=emu.access_key_id, access_key_secret=emu.access_key_secret,
                              region_id="cn-hangzhou", endpoint=emu.endpoint, protocol="https", ca=emu.ca_file)),
                RuntimeOptions(ca=emu.ca_file))

    def cancel_outside(self, emu: Any, name: str) -> list[str]:
        """StopJob through the official SDK with the user's AccessKey, as the DLC console does."""
        (job_id,) = [j["JobId"] for j in emu.jobs() if j["DisplayName"] == name]
        client, runtime = self._as_user(emu)
        client.stop_job_with_options(job_id, {}, runtime)
        return ["PAI-DLC job", "was stopped outside this experiment", job_id]

    def processes(self, emu: Any) -> list[int]:
        return emu.live_pids()

    def secrets(self, emu: Any) -> list[str]:
        return [emu.access_key_secret]

    def wrong_credentials(self, request: pytest.FixtureRequest,
                          base: Path) -> tuple[dict[str, Any], tuple[str, ...], str | None]:
        return (self.config(self.emulator(request), base, accessKeySecret="not-the-secret"),
                ("SignatureDoesNotMatch", "accessKeySecret"), "not-the-secret")

    def fault_emulator(self, request: pytest.FixtureRequest) -> Any:
        return request.getfixturevalue("dlc_factory")()

    def fault_words(self) -> tuple[str, ...]:
        return ("InternalError", "ServiceUnavailable")  # Alibaba Cloud's codes: the SDK keeps no HTTP status

    def inject_faults(self, emu: Any) -> None:
        """The gateway answers three InternalErrors, three ServiceUnavailables, then hangs twice."""
        import time

        for status in (500, 503):
            emu.fault(status, count=3)
            emu.wait_for(lambda s=status: [r["status"] for r in emu.requests()].count(s) == 3, 60,
                         what=f"three requests answered {status}")
        emu.fault(None, count=2, hang=4)
        time.sleep(4.5)

    def fail_submissions(self, emu: Any, count: int) -> None:
        emu.fault(503, count=count, method="POST", path=r"^/api/v1/jobs$")  # CreateJob

    def waiting(self, request: pytest.FixtureRequest, base: Path) -> tuple[Any, dict[str, Any], int, tuple[str, ...]]:
        dlc = self.emulator(request)
        dlc.hold("Queuing")  # the workspace's quota has no room (dlc_in_shared lets go afterwards)
        return dlc, self.config(dlc, base, pollInterval="0.3s"), 0, ("Queuing",)

    def let_waiting_run(self, emu: Any) -> None:
        emu.hold(None)

    def held_request(self, emu: Any, backend: Any, env: Any) -> tuple[Any, Any]:
        """The job as GetJob answers the user (the official SDK, signed with their AccessKey): the
        CreateJob request's fields among the ones the service adds."""
        from alibabacloud_pai_dlc20201203.models import GetJobRequest

        built = backend.build_request(placeholders(env)).to_map()
        (job_id,) = [j["JobId"] for j in emu.jobs() if j["DisplayName"] == built["DisplayName"]]
        client, runtime = self._as_user(emu)
        job = client.get_job_with_options(job_id, GetJobRequest(), {}, runtime).body.to_map()
        held = {k: job.get(k) for k in built}
        held["UserCommand"] = literals_as_placeholders(held["UserCommand"], env)
        # GetJob names a data source by its id (its model has no DataSourceType: the workspace's source has it)
        built["DataSources"] = [{"DataSourceId": d["DataSourceId"]} for d in built["DataSources"]]
        return held, built


class Slurm(JobPlatform):
    """The real 2-node cluster (session-scoped, root's home group); reuse mode by default."""

    name, fixture, group, tag, reuse = "slurm", "slurm", "root-home", "Slurm", True
    running_state, stopped_state = "RUNNING", "CANCELLED"
    ended_states = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL",
                    "OUT_OF_MEMORY", "DEADLINE")
    clean_states = ("COMPLETED", "CANCELLED")
    failed_state = "FAILED"
    not_dialled_words = ("is RUNNING", "Slurm job", "agent-*.log")

    def config(self, emu: Any, base: Path, **ts: Any) -> dict[str, Any]:
        return {"trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(_code(base)),
                "trialConcurrency": 2, "trialGracePeriod": 2, "experimentWorkingDirectory": str(base / "exps"),
                "trainingService": {"platform": "slurm", "nniManagerIp": "127.0.0.1", "reuseMode": True,
                                    "trialCpuNumber": 1, "trialMemorySize": "200mb", "pollInterval": "0.3s", **ts}}

    def stuck(self, request: pytest.FixtureRequest, base: Path, timeout: str) -> tuple[Any, dict[str, Any]]:
        slurm = self.emulator(request)  # the batch script's prologue never ends: srun never starts the agent
        data = self.config(slurm, base, reuseMode=False, agentConnectTimeout=timeout, prologue=["sleep 600"])
        data["trialConcurrency"] = 1
        return slurm, data

    def states(self, emu: Any, prefix: str) -> dict[str, str]:
        return {j["name"]: j["state"] for j in emu.jobs(prefix)}

    def live(self, emu: Any, prefix: str) -> list[str]:
        return sorted(j["name"] for j in emu.live_jobs(prefix))

    def canceled_states(self) -> tuple[str, ...]:
        return self.clean_states  # the agent ends its trial's job itself, unless the manager's scancel lands first

    def waiting(self, request: pytest.FixtureRequest, base: Path) -> tuple[Any, dict[str, Any], int, tuple[str, ...]]:
        slurm = self.emulator(request)  # two nodes: the third job pends
        return slurm, self.config(slurm, base, reuseMode=False), 2, ("PENDING", "Resources", "1 node(s)")

    def cancel_outside(self, emu: Any, name: str) -> list[str]:
        (job,) = emu.jobs(name)
        emu.run("scancel", job["id"])
        return ["CANCELLED", "scancel", job["id"]]  # the agent's SIGTERM, explained in Slurm's words

    def processes(self, emu: Any) -> list[int]:
        return emu.job_processes()

    def wait_for(self, emu: Any, predicate: Any, timeout: float, what: str) -> Any:
        return emu.wait_for(predicate, timeout, what)

    def held_request(self, emu: Any, backend: Any, env: Any) -> tuple[Any, Any]:
        """The script Slurm holds for the job (`scontrol write batch_script`): no secret is in it
        (tokens and the CA are files in the job's directory), so it is the environment's request whole."""
        import subprocess

        request = backend.build_request(env)
        assert request["argv"] == ["sbatch", "--parsable"]
        held = subprocess.run(["scontrol", "write", "batch_script", backend.jobs[env.env_id].ref, "-"],
                              capture_output=True, text=True, check=True, timeout=60).stdout
        return held, request["script"]


PLATFORMS: tuple[JobPlatform, ...] = (OpenPai(), Dlts(), Aml(), Dlc(), Slurm())


GONE = "(deleted)"  # what `states` calls a Kubernetes job whose object is gone (see KubeJobs)


class KubeJobs(JobPlatform):
    """The Kubernetes platforms (manager/nni_manager/backends/kubernetes; `-k kube`): a job is an environment's
    main object, `nniexp<exp><env>` (a DNS label), in the test's own namespace of the session's
    shared emulator (tests/support/kube/fixtures.py); pods on the emulator's host network dial the
    hub at nniManagerIp. Kubernetes has no stopped state: a job is stopped, by the manager or by
    anyone, by deleting its object, which then is in no listing; the namespace's events about it
    outlive it (those of its pods, `<object>-<role>-<index>`, where its operator records none), so
    `states` names such a job GONE (its stopped and clean state)."""

    tag, reuse, running_state = "Kube", True, "Running"
    stopped_state, clean_states = GONE, (GONE,)  # clean_up deletes every object of the experiment
    failed_state = GONE  # a failed trial's object is deleted too: Kubernetes keeps no failed job
    container: ClassVar[str]  # the agent's container in the job's pods

    def canceled_states(self) -> tuple[str, ...]:
        """Deleted by the manager, or ended by its agent once the cancelled trial was (a job of its own
        completes when its agent exits), whichever lands first: Slurm's race too."""
        return tuple(s for s in self.ended_states if "Fail" not in s)

    def job_prefix(self, experiment_id: str) -> str:
        return f"nniexp{experiment_id.lower()}"

    def job_of(self, prefix: str, trial_id: str, environment_id: str) -> str:
        """env1 in a pool, else trial-<id> (service/elastic.py): one object each, named for it."""
        return prefix + (environment_id or f"trial-{trial_id}").lower().replace("-", "")

    def service(self, emu: Any, base: Path, ts: dict[str, Any]) -> dict[str, Any]:
        """The config with the platform's trainingService `ts` (tests/support/kube/harness.py)."""
        from tests.support.kube.harness import config_dict

        return config_dict(emu, base, ts, trialConcurrency=2)

    def stuck(self, request: pytest.FixtureRequest, base: Path, timeout: str) -> tuple[Any, dict[str, Any]]:
        """The pod runs what a `podSpec` override puts in the agent's container (as when debugging an
        image): `sleep`, so the agent never starts."""
        emu = self.emulator(request)
        data = self.config(emu, base, reuseMode=False, agentConnectTimeout=timeout,
                           podSpec={"containers": [{"name": self.container, "command": ["sleep", "600"]}]})
        data["trialConcurrency"] = 1
        return emu, data

    def objects(self, emu: Any) -> list[dict[str, Any]]:
        """The main objects in the test's namespace, as the API serves them."""
        raise NotImplementedError

    def state_of(self, obj: dict[str, Any]) -> str:
        raise NotImplementedError

    def states(self, emu: Any, prefix: str) -> dict[str, str]:
        events = emu.core().list_namespaced_event(emu.namespace).items  # of the objects and their pods
        out = {e.involved_object.name.split("-")[0]: GONE for e in events if e.involved_object.name.startswith(prefix)}
        out.update({o["metadata"]["name"]: self.state_of(o) for o in self.objects(emu)
                    if o["metadata"]["name"].startswith(prefix)})
        return out

    def processes(self, emu: Any) -> list[int]:
        return emu.leftover_processes()

    def wrong_credentials(self, request: pytest.FixtureRequest,
                          base: Path) -> tuple[dict[str, Any], tuple[str, ...], str | None]:
        """A kubeconfig whose bearer token the API server does not know."""
        from tests.support.kube.harness import kubeconfig_with_token

        emu = self.emulator(request)
        kc = kubeconfig_with_token(emu, base / "kc", "not-a-token")
        return self.config(emu, base, kubeConfig=str(kc)), ("401",), "not-a-token"

    fault_statuses = (429, 503)
    plural: ClassVar[str]  # the main object's resource, as its path names it

    def fault_emulator(self, request: pytest.FixtureRequest) -> Any:
        """The shared emulator: its storms hit only this test's namespace (`_in_namespace`)."""
        return self.emulator(request)

    def _in_namespace(self, emu: Any) -> str:
        return f"/namespaces/{emu.namespace}/"

    def _storm(self, emu: Any, status: int, count: int, **match: str) -> None:
        """A storm of `count` answers, waited out (the backend's next requests meet it)."""
        emu.storm(status, count, path=match.pop("path", self._in_namespace(emu)), **match)
        emu.wait_for(lambda: emu.faults()["left"] == 0, 60, interval=0.2, what=f"{count} requests answered {status}")

    def inject_faults(self, emu: Any) -> None:
        """API Priority and Fairness throttles four requests (429, Retry-After), then an etcd leader
        change or a load balancer losing the API server answers four more 503."""
        self._storm(emu, 429, 4)
        self._storm(emu, 503, 4)

    def fail_submissions(self, emu: Any, count: int) -> None:
        """The next `count` creations of a main object answer 503 (the Status body the real server
        sends) and create nothing."""
        emu.storm(503, count, path=f"{self._in_namespace(emu)}{self.plural}$", method="POST")

    def clear_faults(self, emu: Any) -> None:
        emu.storm(503, 0)

    def answered_statuses(self, emu: Any) -> set[int]:
        return {int(s) for s in emu.faults()["answered"]}

    def fault_words(self) -> tuple[str, ...]:
        return ("429", "503", "TooManyRequests", "ServiceUnavailable")

    def waiting(self, request: pytest.FixtureRequest, base: Path) -> tuple[Any, dict[str, Any], int, tuple[str, ...]]:
        """A cluster of one node with one GPU (an emulator of the test's own: nodes are cluster-wide),
        each trial's pod asking for it: the second pod is Pending, the scheduler's words its reason."""
        from tests.support.kube.fixtures import SHARED_CRD_GROUPS, KubeNamespace

        groups = SHARED_CRD_GROUPS if self.fixture == "kube_crd_ns" else ()
        emu = KubeNamespace(request.getfixturevalue("kube_factory")(nodes=["node-1=8,16384,1"], crd_groups=groups),
                            "default")
        return emu, self.one_gpu(self.config(emu, base, reuseMode=False)), 1, (
            "FailedScheduling", "0/1 nodes are available", "Insufficient nvidia.com/gpu")

    def one_gpu(self, data: dict[str, Any]) -> dict[str, Any]:
        """`data` with each environment's pod asking for one GPU."""
        raise NotImplementedError

    def secrets(self, emu: Any) -> list[str]:
        return [emu.token]

    def wait_for(self, emu: Any, predicate: Any, timeout: float, what: str) -> Any:
        return emu.wait_for(predicate, timeout, interval=0.3, what=what)  # each look is two or more API calls

    def main_object(self, emu: Any, name: str) -> dict[str, Any]:
        """The environment's main object as the API serves it."""
        (obj,) = [o for o in self.objects(emu) if o["metadata"]["name"] == name]
        return obj

    def dry_run_built(self, backend: Any) -> tuple[Any, Any]:
        """The dry run shows the objects once per experiment (the agent's ConfigMap), then the
        environment's Secret (its entries as placeholders: tokens are minted at start) and main
        object, which are `build_request`'s of the environment the dry run names (a pool's env1,
        else a sample trial's own)."""
        import dataclasses

        from nni_manager.backends.kubernetes.cluster import DRY_RUN_TRIAL

        shown = backend.render().requests
        assert [r["kind"] for r in shown[:1]] == ["ConfigMap"] and shown[-2]["kind"] == "Secret", shown
        assert all(v.startswith("<") for v in shown[-2]["stringData"].values()), shown[-2]
        env = backend.dry_run_env("env1" if backend.reuse else f"trial-{DRY_RUN_TRIAL.lower()}")
        if not backend.reuse:
            env = dataclasses.replace(env, trial_id=DRY_RUN_TRIAL)
        secret, main = backend.build_request(env)
        return ([sorted(shown[-2]["stringData"]), shown[-1]], [sorted(secret["data"]), main])

    def held_request(self, emu: Any, backend: Any, env: Any) -> tuple[Any, Any]:
        """The environment's Secret (the same entries; the minted tokens and CA are the values) and
        main object as the API serves them, against `build_request` of the environment."""
        secret, main = backend.build_request(env)
        held_secret = emu.core().read_namespaced_secret(secret["metadata"]["name"], emu.namespace)
        held = self.main_object(emu, main["metadata"]["name"])
        # every field the backend sets, as it set it; the API server adds defaults (a pod's, a CRD
        # schema's), status and the owner reference the backend adds at submit
        return (sorted(held_secret.data or {}), _as_in(held, main)), (sorted(secret["data"]), main)

    def wait_clean(self, emu: Any, prefix: str) -> None:
        """Every job ended and no process is left (JobPlatform's), and nothing labelled as the
        experiment's is left in its namespace: no pod (nor the hub relay's), Secret, ConfigMap or Service."""
        super().wait_clean(emu, prefix)
        core, ns = emu.core(), emu.namespace

        def left() -> dict[str, list[str]]:
            found = {"pods": core.list_namespaced_pod(ns).items, "secrets": core.list_namespaced_secret(ns).items,
                     "configmaps": core.list_namespaced_config_map(ns).items,
                     "services": core.list_namespaced_service(ns).items}
            return {kind: names for kind, objs in found.items() if (names := [
                o.metadata.name for o in objs if self.job_prefix((o.metadata.labels or {}).get("expId", "")) == prefix])}

        try:
            emu.wait_for(lambda: not left(), 30, what="the experiment's objects to go")
        except AssertionError:
            raise AssertionError(f"left in namespace {ns}: {left()}") from None


def _as_in(held: Any, built: Any) -> Any:
    """`held` cut to the fields `built` has (its dicts' keys, its lists' length), to compare the two."""
    if isinstance(built, dict) and isinstance(held, dict):
        return {k: _as_in(held[k], v) for k, v in built.items() if k in held}
    if isinstance(built, list) and isinstance(held, list) and len(built) == len(held):
        return [_as_in(h, b) for h, b in zip(held, built)]
    return held


class KubePods(KubeJobs):
    """platform: kubernetes, one plain pod per environment; its state is the pod's phase."""

    name, fixture, container, plural = "kube-pods", "kube_ns", "trial", "pods"
    ended_states = (GONE, "Succeeded", "Failed")

    def config(self, emu: Any, base: Path, **ts: Any) -> dict[str, Any]:
        from tests.support.kube.harness import pods_service

        return self.service(emu, base, pods_service(**{"reuseMode": True, "pollInterval": "0.5s", **ts}))

    def objects(self, emu: Any) -> list[dict[str, Any]]:
        from tests.support.kube.harness import pod_json

        return pod_json(emu)

    def state_of(self, obj: dict[str, Any]) -> str:
        return str((obj.get("status") or {}).get("phase") or "")

    def one_gpu(self, data: dict[str, Any]) -> dict[str, Any]:
        data["trainingService"]["gpuNumber"] = 1
        return data

    def main_object(self, emu: Any, name: str) -> dict[str, Any]:
        """`GET .../pods/<name>` (a list's items carry no kind nor apiVersion)."""
        status, _, body = emu.raw("GET", f"/api/v1/namespaces/{emu.namespace}/pods/{name}")
        assert status == 200, body
        return dict(json.loads(body))

    def cancel_outside(self, emu: Any, name: str) -> list[str]:
        """`kubectl delete pod`."""
        emu.core().delete_namespaced_pod(name, emu.namespace)
        return ["deleted", name]


class KubeOperator(KubeJobs):
    """A platform whose job is an operator's custom object (`api`: group, version, plural), with one
    worker in the image the default emulator knows."""

    fixture = "kube_crd_ns"
    api: ClassVar[tuple[str, str, str]]

    def worker(self) -> dict[str, Any]:
        from tests.support.kube.harness import IMAGE

        return {"command": "python3 trial.py", "cpuNumber": 0.5, "memorySize": "512mb", "dockerImage": IMAGE}

    def custom(self, emu: Any) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(emu.api_client())

    def objects(self, emu: Any) -> list[dict[str, Any]]:
        group, version, plural = self.api
        return self.custom(emu).list_namespaced_custom_object(group, version, emu.namespace, plural)["items"]

    def cancel_outside(self, emu: Any, name: str) -> list[str]:
        """`kubectl delete <kind> <name>`: its pods go with it."""
        group, version, plural = self.api
        self.custom(emu).delete_namespaced_custom_object(group, version, emu.namespace, plural, name)
        return ["deleted", name]


class KubeTfJob(KubeOperator):
    """platform: kubeflow with the training operator's TFJob; its state is the newest true condition,
    as `kubectl get tfjob` shows it."""

    name, tag, container = "kube-tfjob", "Tf", "tensorflow"
    ended_states = (GONE, "Succeeded", "Failed")
    api, plural = ("kubeflow.org", "v1", "tfjobs"), "tfjobs"

    def config(self, emu: Any, base: Path, **ts: Any) -> dict[str, Any]:
        worker = {"replicas": 1, **self.worker()}
        return self.service(emu, base, {"platform": "kubeflow", "operator": "tf-operator", "apiVersion": "v1",
                                        "reuseMode": True, "pollInterval": "0.5s", "worker": worker, **ts})

    def one_gpu(self, data: dict[str, Any]) -> dict[str, Any]:
        data["trainingService"]["worker"]["gpuNumber"] = 1
        return data

    def state_of(self, obj: dict[str, Any]) -> str:
        true = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
        return str(true[-1]["type"]) if true else ""


class KubeFramework(KubeOperator):
    """platform: frameworkcontroller (one task role); its state is the Framework's status.state."""

    name, tag, container = "kube-framework", "Fc", "framework"
    running_state, ended_states = "AttemptRunning", (GONE, "AttemptCompleted", "Completed")
    api, plural = ("frameworkcontroller.microsoft.com", "v1", "frameworks"), "frameworks"

    def config(self, emu: Any, base: Path, **ts: Any) -> dict[str, Any]:
        role = {"name": "worker", "taskNumber": 1, "gpuNumber": 0, **self.worker(),
                "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 1, "minSucceedTaskCount": 1}}
        return self.service(emu, base, {"platform": "frameworkcontroller", "reuseMode": True, "pollInterval": "0.5s",
                                        "taskRoles": [role], **ts})

    def one_gpu(self, data: dict[str, Any]) -> dict[str, Any]:
        data["trainingService"]["taskRoles"][0]["gpuNumber"] = 1
        return data

    def cancel_outside(self, emu: Any, name: str) -> list[str]:
        """`kubectl patch framework <name> -p '{"spec":{"executionType":"Stop"}}'`, FrameworkController's
        own way to stop a Framework: its pods go, it completes with code -210 and stays."""
        group, version, plural = self.api
        self.custom(emu).patch_namespaced_custom_object(group, version, emu.namespace, plural, name,
                                                        {"spec": {"executionType": "Stop"}})
        return ["StopFrameworkRequested", name]

    def state_of(self, obj: dict[str, Any]) -> str:
        return str((obj.get("status") or {}).get("state") or "")


PLATFORMS = (*PLATFORMS, KubePods(), KubeTfJob(), KubeFramework())
