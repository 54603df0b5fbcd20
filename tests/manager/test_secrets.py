"""Secrets (issue 10 item 6): ONE rule, `config.is_secret(name)`, keeps every secret config field out
of repr(), out of experiment.db and out of the manager's log.

Per platform with secret fields, a config as users write it (YAML through `load_config`) holding
distinctive secrets (`S3cr3t-<platform>-<field>-9f1c`) is run as far as loopback allows: remote and
slurm dial a loopback port where nothing listens, OpenPAI and DLTS a loopback server that refuses
every request (401) after checking the secret was sent. Then every file of the experiment directory
(experiment.db and its -wal, nnimanager.log, dispatcher logs, trial directories), every log record
(DEBUG, all loggers), the process's stdout/stderr and the errors raised are searched for every
secret, and the non-secret values beside them must be in the store (so the search means something).
"""
from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import logging
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nni_manager.config import REDACTED, ExperimentConfig, is_secret, redacted, secret_values
from nni_manager.loader import load_config
from nni_manager.experiment import Experiment, NoWorkerError, _log_file
from nni_manager.service import create_training_service
from nni_manager.service.nni_api import _redacted
from nni_manager.store import Store
from tests.support.manager.helpers import TRIAL, form, wait_status
from tests.support.bounded import run_bounded


def secret(platform: str, field: str) -> str:
    return f"S3cr3t-{platform}-{field}-9f1c"


# ---------------------------------------------------------------------------------------------
# The rule

SECRET_NAMES = ["password", "passwd", "passWord", "sshPassphrase", "ssh_passphrase", "passphrase", "token",
                "accountKey", "keyVaultKey", "apiKey", "WANDB_API_KEY", "AZURE_CLIENT_SECRET", "clientSecret",
                "NNI_AGENT_TOKEN", "connectionString", "AZURE_STORAGE_CONNECTION_STRING", "secrets", "password2"]
# Paths and names say where a secret is (stored: the user needs them to debug a config); a switch
# is no secret; parameter names that merely contain a secret word are none either.
NOT_SECRET_NAMES = ["sshKeyFile", "ssh_key_file", "sshKeyPath", "hubKeyFile", "hub_key_file", "tokenFile",
                    "privateRegistryAuthPath", "keyVaultName", "keyVault", "storageConfigName",
                    "strictHostKeyChecking", "strict_host_key_checking", "known_hosts_file", "max_tokens",
                    "key_dim", "monkey", "keyboard", "username", "user", "email", "host", "PWD", ""]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name: str) -> None:
    assert is_secret(name)


@pytest.mark.parametrize("name", NOT_SECRET_NAMES)
def test_not_secret_names(name: str) -> None:
    assert not is_secret(name)


def test_redacted_follows_the_rule_and_keeps_the_rest() -> None:
    value = {"machine_list": [{"password": "pw", "host": "h", "ssh_key_file": "/k", "strict_host_key_checking": True,
                               "ssh_passphrase": None}],
             "search_space": {"max_tokens": {"_type": "choice", "_value": [1]}, "api_key": {"_type": "choice",
                                                                                            "_value": [2]}},
             "agent_env": {"WANDB_API_KEY": "k", "CUDA_HOME": "/cuda"},
             "pod_spec": {"env": [{"name": "API_KEY", "value": "v"}, {"name": "PATH", "value": "/bin"}]}}
    assert redacted(value) == _redacted(value) == {
        "machine_list": [{"password": REDACTED, "host": "h", "ssh_key_file": "/k", "strict_host_key_checking": True,
                          "ssh_passphrase": None}],
        "search_space": value["search_space"],  # parameter names, never credentials: view mode shows them
        "agent_env": {"WANDB_API_KEY": REDACTED, "CUDA_HOME": "/cuda"},
        "pod_spec": {"env": [{"name": "API_KEY", "value": REDACTED}, {"name": "PATH", "value": "/bin"}]}}


def test_manager_log_masks_every_secret_of_the_config(tmp_path: Path) -> None:
    """The last guard: should a message, its arguments or a traceback carry a secret of the config,
    nnimanager.log shows *** (the values found by the same rule)."""
    pw = secret("log", "password")
    config = load_config({"trialCommand": "t", "trialConcurrency": 1, "trainingService": {
        "platform": "remote", "agentEnv": {"API_TOKEN": secret("log", "agentEnv")},
        "machineList": [{"host": "127.0.0.1", "user": "u", "password": pw}]}}, base_dir=tmp_path)
    assert secret_values(config) == {pw, secret("log", "agentEnv")}
    logger = logging.getLogger("nni_manager.test_secrets")
    level = logging.getLogger("nni_manager").level
    handler = _log_file(tmp_path, "debug", secret_values(config))
    try:
        logger.error("a careless message: %s", pw)
        try:
            raise RuntimeError(f"auth failed for {secret('log', 'agentEnv')}")
        except RuntimeError:
            logger.exception("a careless traceback")
    finally:
        logging.getLogger("nni_manager").removeHandler(handler)
        logging.getLogger("nni_manager").setLevel(level)
        handler.close()
    text = (tmp_path / "log" / "nnimanager.log").read_text()
    assert "a careless message: ***" in text and "auth failed for ***" in text and "S3cr3t" not in text


CONFIG_MODULES = ("nni_manager.config.model", "nni_manager.config.hybrid", "nni_manager.ssh.machine",
                  "nni_manager.backends.remote.config", "nni_manager.backends.openpai.config",
                  "nni_manager.backends.dlts", "nni_manager.backends.aml", "nni_manager.backends.kubernetes.config",
                  "nni_manager.backends.slurm.config", "nni_manager.config.shared_storage")
# Every secret config field of every platform (aml: credentials come from Azure's environment or
# managed identity, never the config; kubernetes/kubeflow/frameworkcontroller: NNI's azureStorage
# and keyVault fields name a share and a vault secret, and are dropped).
SECRET_FIELDS = {("SshMachine", "password"), ("SshMachine", "ssh_passphrase"),  # remote machines, slurm loginNode
                 ("OpenpaiConfig", "token"), ("DltsConfig", "password"),
                 ("SharedStorageConfig", "storage_account_key")}


def test_every_secret_config_field_is_known_and_out_of_repr() -> None:
    found = set()
    for module in map(importlib.import_module, CONFIG_MODULES):
        for cls in vars(module).values():
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == module.__name__):
                continue
            for f in dataclasses.fields(cls):
                if is_secret(f.name):
                    owner = next(c for c in reversed(cls.__mro__) if f.name in getattr(c, "__annotations__", {}))
                    found.add((owner.__name__, f.name))
                    assert not f.repr, f"{cls.__name__}.{f.name}: a secret; declare it field(repr=False)"
    assert found == SECRET_FIELDS  # a new one: check the store, logs and errors keep it out too, then add it


# ---------------------------------------------------------------------------------------------
# Helpers


@pytest.fixture
def port() -> Iterator[int]:
    """A loopback port where nothing listens: bound (so nobody else takes it), never listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A bound loopback socket for `Refusing` (the port must be in the YAML before it serves)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s


class Refusing:
    """A loopback HTTP server refusing every request with 401, remembering what it was sent."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.requests: list[tuple[str, dict[str, str], dict[str, str]]] = []  # (path, headers, query)

    async def __aenter__(self) -> Refusing:
        from aiohttp import web

        async def refuse(request: web.Request) -> web.Response:
            self.requests.append((request.path, dict(request.headers), dict(request.query)))
            return web.json_response({"code": "UnauthorizedUserError", "message": "Guest is not allowed"}, status=401)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", refuse)
        self.runner = web.AppRunner(app, access_log=None)  # its access log would show the query string
        await self.runner.setup()
        await web.SockSite(self.runner, self.sock).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


def write_config(base: Path, text: str) -> Path:
    """The trial code and `config.yml` (relative paths start at its folder) in `base`."""
    code = base / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    path = base / "config.yml"
    path.write_text(text)
    return path


def load(path: Path, secrets: list[str]) -> ExperimentConfig:
    config = load_config(path)
    shown = repr(config) + repr(config.training_service.options)
    assert not [s for s in secrets if s in shown], shown
    assert set(secrets) <= secret_values(config)  # the log mask knows each one, by the same rule
    return config


async def run_service(config: ExperimentConfig, trial: str | None = None) -> tuple[Path, list[str]]:
    """Start the experiment's training service with the manager's log at DEBUG, submit one trial,
    wait for it to end (`trial`: the status it must reach), clean up. (experiment dir, errors)."""
    ts = create_training_service(config)
    logger = logging.getLogger("nni_manager")
    level = logger.level
    handler = _log_file(ts.experiment_dir, "debug", secret_values(config))
    errors: list[str] = []
    try:
        async with ts:
            job = await ts.submit_trial_job(form(0, x=1))
            detail = await wait_status(ts, job.id, trial or "SUCCEEDED", "FAILED", "USER_CANCELED", "SYS_CANCELED",
                                       timeout=30)
            errors.append(detail.message)
            if trial:
                assert detail.status.value == trial, detail.message
    except Exception as e:  # noqa: BLE001 - the platform is unreachable: its error is searched too
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        logger.removeHandler(handler)
        handler.close()
        logger.setLevel(level)
    return ts.experiment_dir, errors


def assert_no_secret(exp_dir: Path, secrets: list[str], kept: list[str], caplog: pytest.LogCaptureFixture,
                     capfd: pytest.CaptureFixture[str], errors: list[str]) -> dict[str, Any]:
    """No secret in any file under `exp_dir`, the log records, stdout/stderr or `errors`; every
    `kept` value in experiment.db's bytes. Returns the stored config."""
    files = [p for p in exp_dir.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert "experiment.db" in names and "nnimanager.log" in names, names
    for path in files:
        data = path.read_bytes()
        leaked = [s for s in secrets if s.encode() in data]
        assert not leaked, f"{leaked} in {path}"
    db = b"".join(p.read_bytes() for p in files if p.name.startswith("experiment.db"))  # + -wal, -shm
    missing = [k for k in kept if k.encode() not in db]
    assert not missing, f"{missing} not in experiment.db: the search would prove nothing"
    out, err = capfd.readouterr()
    logs = caplog.text + "\n".join(r.getMessage() for r in caplog.records)
    assert caplog.records, "nothing was logged: the search would prove nothing"
    for where, text in (("log records", logs), ("stdout", out), ("stderr", err), ("errors", "\n".join(errors))):
        leaked = [s for s in secrets if s in text]
        assert not leaked, f"{leaked} in {where}: {text[-3000:]}"
    store = Store.open_readonly(exp_dir)
    try:
        config = store.experiment()["config"]
    finally:
        store.close()
    assert REDACTED in json.dumps(config)
    return config


HEAD = """\
trialCommand: {python} trial.py
trialCodeDirectory: code
trialConcurrency: 1
experimentWorkingDirectory: exps
logLevel: debug
"""


# ---------------------------------------------------------------------------------------------
# Platforms



def run_refused(listener: socket.socket, config: Any) -> tuple[Path, list[str], list[Any]]:
    """Run the service against a platform that refuses every request: (experiment dir, errors,
    the requests the platform received)."""

    async def body() -> tuple[Path, list[str], list[Any]]:
        async with Refusing(listener) as server:
            exp_dir, errors = await run_service(config)
        return exp_dir, errors, server.requests

    return asyncio.run(body())

def test_remote(short_dir: Path, port: int, caplog: pytest.LogCaptureFixture,
                capfd: pytest.CaptureFixture[str]) -> None:
    """The whole experiment (tuner, manager log at logLevel debug) on two machines that cannot be
    reached: a password one and a key-file one with its passphrase; a secret agentEnv variable."""
    caplog.set_level(logging.DEBUG)
    key_file = short_dir / "id_test"
    key_file.write_text("not a key: the connection is refused before it is read\n")
    secrets = [secret("remote", "password"), secret("remote", "sshPassphrase"), secret("remote", "agentEnv")]
    path = write_config(short_dir, HEAD.format(python=sys.executable) + f"""\
maxTrialNumber: 1
searchSpace: {{max_tokens: {{_type: choice, _value: [7]}}}}
tuner: {{name: Random}}
trainingService:
  platform: remote
  reconnectWindow: 1s
  agentEnv: {{WANDB_API_KEY: {secrets[2]}, CUDA_HOME: /opt/cuda-kept}}
  machineList:
    - {{host: 127.0.0.1, port: {port}, user: alice-remote, password: {secrets[0]}}}
    - {{host: 127.0.0.1, port: {port}, user: bob-remote, sshKeyFile: {key_file}, sshPassphrase: {secrets[1]},
       strictHostKeyChecking: false}}
""")
    config = load(path, secrets)
    experiment = Experiment(config, poll_interval=0.1)
    with pytest.raises(NoWorkerError):
        run_bounded(experiment.run(), 60)
    result = experiment.result()
    assert "cannot connect" in result.error, result.error  # no machine is usable
    stored = assert_no_secret(result.experiment_dir, secrets, ["alice-remote", "bob-remote", str(key_file),
                                                               "/opt/cuda-kept", "max_tokens"],
                              caplog, capfd, [result.error])
    alice, bob = stored["training_service"]["options"]["machine_list"]
    assert (alice["password"], alice["ssh_passphrase"], bob["password"], bob["ssh_passphrase"]) == \
        (REDACTED, None, None, REDACTED)
    assert bob["strict_host_key_checking"] is False and alice["strict_host_key_checking"] is True
    assert stored["search_space"] == {"max_tokens": {"_type": "choice", "_value": [7]}}
    assert stored["training_service"]["agent_env"] == {"WANDB_API_KEY": REDACTED, "CUDA_HOME": "/opt/cuda-kept"}


def test_hybrid_v1_remote_passwd(short_dir: Path, port: int, caplog: pytest.LogCaptureFixture,
                                 capfd: pytest.CaptureFixture[str]) -> None:
    """NNI v1 hybrid (local + remote, the machine's v1 `passwd` and `passphrase`): a trial runs
    on the local agent, the remote machine cannot be reached."""
    caplog.set_level(logging.DEBUG)
    secrets = [secret("hybrid", "passwd"), secret("hybrid", "passphrase")]
    path = write_config(short_dir, f"""\
authorName: nni
experimentName: secrets
trialConcurrency: 1
maxExecDuration: 1h
trainingServicePlatform: hybrid
logDir: exps
searchSpace: {{x: {{_type: choice, _value: [1]}}}}
tuner: {{builtinTunerName: Random}}
trial: {{command: {sys.executable} trial.py, codeDir: code, gpuNum: 0}}
hybridConfig: {{trainingServicePlatforms: [local, remote]}}
machineList:
  - {{ip: 127.0.0.1, port: {port}, username: carol-hybrid, passwd: {secrets[0]}, passphrase: {secrets[1]}}}
""")
    exp_dir, errors = asyncio.run(run_service(load(path, secrets), trial="SUCCEEDED"))
    assert list((exp_dir / "trials").iterdir()), "the trial's directory is searched too"
    stored = assert_no_secret(exp_dir, secrets, ["carol-hybrid"], caplog, capfd, errors)
    _, remote = stored["training_service"]["options"]["services"]
    (machine,) = remote["options"]["machine_list"]
    assert (machine["user"], machine["password"], machine["ssh_passphrase"]) == ("carol-hybrid", REDACTED, REDACTED)


def test_openpai(short_dir: Path, listener: socket.socket, caplog: pytest.LogCaptureFixture,
                 capfd: pytest.CaptureFixture[str]) -> None:
    """The token (sent, refused), and the secrets of the user's own job protocol: its `secrets`
    section and a private registry's password."""
    caplog.set_level(logging.DEBUG)
    secrets = [secret("openpai", "token"), secret("openpai", "protocolSecrets"), secret("openpai", "registryPassword")]
    port = listener.getsockname()[1]
    path = write_config(short_dir, HEAD.format(python=sys.executable) + f"""\
trainingService:
  platform: openpai
  host: http://127.0.0.1:{port}
  username: dave-openpai
  token: {secrets[0]}
  nniManagerIp: 127.0.0.1
  openpaiConfig:
    protocolVersion: 2
    name: secrets
    type: job
    prerequisites:
      - {{type: dockerimage, name: image, uri: registry.example/private:1,
         auth: {{username: dave-registry, password: {secrets[2]}, registryuri: registry.example}}}}
    secrets: {{mine: {secrets[1]}}}
    taskRoles:
      worker:
        instances: 1
        dockerImage: image
        resourcePerInstance: {{cpu: 1, memoryMB: 1024, gpu: 0}}
        commands: [{sys.executable} trial.py]
""")
    config = load(path, secrets)

    exp_dir, errors, requests = run_refused(listener, config)
    assert any(h.get("Authorization") == f"Bearer {secrets[0]}" for _, h, _ in requests), requests
    stored = assert_no_secret(exp_dir, secrets, ["dave-openpai", "dave-registry"], caplog, capfd, errors)
    options = stored["training_service"]["options"]
    assert (options["username"], options["token"], options["protocol"]["secrets"]) == \
        ("dave-openpai", REDACTED, REDACTED)
    assert options["protocol"]["prerequisites"][0]["auth"]["password"] == REDACTED


def test_dlts(short_dir: Path, listener: socket.socket, caplog: pytest.LogCaptureFixture,
              capfd: pytest.CaptureFixture[str]) -> None:
    """The dashboard password (DLTS's job token), sent in the query string and refused."""
    caplog.set_level(logging.DEBUG)
    secrets = [secret("dlts", "password")]
    port = listener.getsockname()[1]
    path = write_config(short_dir, HEAD.format(python=sys.executable) + f"""\
trainingService:
  platform: dlts
  dashboard: http://127.0.0.1:{port}/
  email: erin-dlts@example.org
  password: {secrets[0]}
  team: erin-team
  image: python:3.11
  nniManagerIp: 127.0.0.1
""")
    config = load(path, secrets)

    exp_dir, errors, requests = run_refused(listener, config)
    assert any(q.get("password") == secrets[0] for _, _, q in requests), requests
    stored = assert_no_secret(exp_dir, secrets, ["erin-dlts@example.org", "erin-team"], caplog, capfd, errors)
    assert stored["training_service"]["options"]["password"] == REDACTED


def test_slurm_login_node(short_dir: Path, port: int, caplog: pytest.LogCaptureFixture,
                          capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    key_file = short_dir / "id_test"
    key_file.write_text("not a key: the connection is refused before it is read\n")
    secrets = [secret("slurm", "password"), secret("slurm", "sshPassphrase")]
    path = write_config(short_dir, HEAD.format(python=sys.executable) + f"""\
trainingService:
  platform: slurm
  partition: frank-partition
  loginNode: {{host: 127.0.0.1, port: {port}, user: frank-slurm, password: {secrets[0]}, sshKeyFile: {key_file},
              sshPassphrase: {secrets[1]}}}
""")
    exp_dir, errors = asyncio.run(run_service(load(path, secrets)))
    assert any("cannot connect" in e for e in errors), errors
    stored = assert_no_secret(exp_dir, secrets, ["frank-slurm", "frank-partition", str(key_file)], caplog, capfd,
                              errors)
    node = stored["training_service"]["options"]["login_node"]
    assert (node["password"], node["ssh_passphrase"]) == (REDACTED, REDACTED)


def test_kubernetes_pod_spec_env_and_kubeconfig_token(short_dir: Path, port: int, caplog: pytest.LogCaptureFixture,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    """No secret field of its own, but a podSpec env entry may carry one literally, and the
    kubeconfig's token must not reach a log either; NNI's keyVault / azureStorage are dropped."""
    caplog.set_level(logging.DEBUG)
    secrets = [secret("kubernetes", "podSpecEnv"), secret("kubernetes", "kubeconfigToken")]
    dropped = [secret("kubernetes", "keyVaultKey"), secret("kubernetes", "azureShare")]
    kubeconfig = short_dir / "kubeconfig"
    kubeconfig.write_text(f"""\
apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: {secrets[1]}}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    path = write_config(short_dir, HEAD.format(python=sys.executable) + f"""\
trainingService:
  platform: kubernetes
  kubeConfig: {kubeconfig}
  namespace: grace-namespace
  nniManagerIp: 127.0.0.1
  keyVault: {{vaultName: grace-vault, name: {dropped[0]}}}
  azureStorage: {{accountName: grace-account, azureShare: {dropped[1]}}}
  podSpec:
    containers:
      - name: trial
        env: [{{name: WANDB_API_KEY, value: {secrets[0]}}}, {{name: GRACE, value: grace-kept}}]
""")
    config = load(path, secrets[:1])
    exp_dir, errors = asyncio.run(run_service(config))
    assert any("cannot reach the API server" in e for e in errors), errors
    stored = assert_no_secret(exp_dir, secrets + dropped, ["grace-namespace", "grace-kept"], caplog, capfd, errors)
    env = stored["training_service"]["options"]["pod_spec"]["containers"][0]["env"]
    assert env == [{"name": "WANDB_API_KEY", "value": REDACTED}, {"name": "GRACE", "value": "grace-kept"}]
