"""Shipped code is trusted by its digest, never by its name or place (issue 31, "shipped code is
trusted by its name").

Each test plays another user of a shared place with real means: a second local account (useradd)
writing a group-writable working directory or storage, a ServiceAccount whose Role allows only
ConfigMaps on the Kubernetes emulator. It plants code where the manager ships the agent or its
dependencies, under the name the manager will use (computable from public wheels), and the real
manager and the real boot step then run. What it planted is refused with one line, or replaced by
verified content, and never runs: its modules write a marker file when imported, which must not
exist. On the code before this issue each of them ran the planted code.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import subprocess
from pathlib import Path
from collections.abc import Callable
from typing import Any

import pytest

from nni_manager.backends import agent_deps
from nni_manager.backends.agent_command import BOOT_FILE, AgentCommand
from nni_manager.backends.slurm import deps as slurm_deps
from nni_manager.backends.slurm.hosts import LocalHost
from tests.support.aml.fixtures import aml_factory  # noqa: F401 (fixture)
from tests.support.kube.fixtures import kube_factory  # noqa: F401 (fixture)
from tests.support.storage.fixtures import azurite  # noqa: F401 (fixture)
from tests.support.openpai.experiments import base  # noqa: F401 (fixture)
from tests.support.openpai.fixtures import pai_factory  # noqa: F401 (fixture)
from tests.support.security.planted import OtherUser, other_user, planted_wheel, shared_dir  # noqa: F401 (fixtures)
from tests.support.bounded import run_bounded

STOCK = Path("/usr/bin/python3")
WHEELHOUSE = Path(__file__).resolve().parents[2] / ".venv" / "agent-wheelhouse"  # scripts/test.sh fills it

# the other user's part: make directories (mode 0777, as a shared working directory has them) and
# copy the planted wheel into each under the given piece names
_PLANT = r"""
import os, shutil, sys
os.umask(0)
src, dirs, names = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
for d in dirs:
    os.makedirs(d, exist_ok=True)
    for n in names:
        shutil.copyfile(src, os.path.join(d, n))
"""


def _need_wheelhouse() -> None:
    if not STOCK.exists():
        pytest.skip("no /usr/bin/python3 on this machine")
    if not (WHEELHOUSE / ".complete").exists():
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")


def _bare_python(where: Path) -> Path:
    subprocess.run([str(STOCK), "-m", "venv", "--without-pip", str(where)], check=True)
    return where / "bin" / "python3"


def test_slurm_agent_deps_planted_by_another_user_never_run(other_user: OtherUser, tmp_path: Path,
                                                             shared_dir: Callable[[str], Path],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A teammate who shares the group-writable experiments directory pre-creates
    `agent-deps/deps-<key>-<hash>/wheels/` holding her wheels under the real pieces' names (both
    the name by wheel names and the name by content are computable from the public wheels). The
    manager refuses the directory she owns in one line; nothing of hers is unpacked or run."""
    _need_wheelhouse()
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(agent_deps.DOWNLOAD_ENV, "0")
    python = _bare_python(tmp_path / "bare")
    host = LocalHost(tmp_path)
    report = asyncio.run(slurm_deps.probe(host, str(python)))
    assert report is not None and report["fixes"], report
    worker = agent_deps.WorkerPython.from_report(report)
    wheels = agent_deps.resolve(worker, WHEELHOUSE)
    by_names = hashlib.sha256("\n".join(f.name for f in wheels.files).encode()).hexdigest()[:10]
    digests = sorted((f.name, hashlib.sha256(f.read_bytes()).hexdigest()) for f in wheels.files)
    by_content = hashlib.sha256("".join(f"{n}={d}\n" for n, d in digests).encode()).hexdigest()[:16]
    shared = shared_dir("nni-shared-exps-")
    marker = tmp_path / "planted-ran"
    planted = planted_wheel(shared / "planted.whl", marker)
    planted.chmod(0o644)
    other_user.run(_PLANT, str(planted), ",".join(f"{shared}/agent-deps/deps-{worker.key}-{h}/wheels"
                                                  for h in (by_names, by_content)),
                   ",".join(agent_deps.piece_name(f) for f in wheels.files))

    refused = ""
    try:
        shipped = asyncio.run(slurm_deps.ship(host, str(python), str(shared), WHEELHOUSE))
    except agent_deps.DependencyError as e:
        refused = str(e)
    else:  # the batch script's boot step, as the compute node runs it, with what the manager chose
        assert shipped is not None
        extra = {"sha256": shipped.sha256} if hasattr(shipped, "sha256") else {}
        command = AgentCommand(agent_id="a", manager="unix:/nonexistent", parts=(shipped.wheels,),
                               deps_to=shipped.lib, **extra)  # type: ignore[arg-type]
        subprocess.run([str(python), str(BOOT_FILE), *command.boot_args(), "--check"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path, env=_own_temp(tmp_path))
    assert not marker.exists(), marker.read_text()
    assert refused.startswith(f"{shared}/agent-deps on this host is not your private directory"), refused
    assert "\n" not in refused and "Fix: " in refused


def test_boot_step_never_reads_an_unpack_directory_another_user_made(other_user: OtherUser, tmp_path: Path,
                                                                    shared_dir: Callable[[str], Path]) -> None:
    """The real boot step, where the shipped wheels and the directory it unpacks into lie in a
    group-writable place: another user pre-creates the unpack directory (`--deps-to`) with her
    modules, and later replaces a shipped piece. Her directory is never read (the verified wheel
    goes into a fresh private directory); her piece is refused in one line naming it."""
    shared = shared_dir("nni-shared-deps-")
    marker = tmp_path / "planted-ran"
    good = tmp_path / "dep-1.0-py3-none-any.whl"
    import zipfile

    with zipfile.ZipFile(good, "w") as zf:
        zf.writestr("dep_mod/__init__.py", "")
    wheels = shared / "wheels"
    wheels.mkdir(mode=0o755)
    (wheels / f"{good.name}.000").write_bytes(good.read_bytes())
    planted = planted_wheel(shared / "planted.whl", marker)
    planted.chmod(0o644)
    other_user.run(r"""
import os, sys, zipfile
os.umask(0)
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
""", str(planted), str(shared / "lib"))  # her `lib`, where the boot step would unpack
    digest = hashlib.sha256(good.read_bytes()).hexdigest()
    extra = ("--sha256", f"{good.name}={digest}")
    check = [str(STOCK), str(BOOT_FILE), "--parts", str(wheels), "--deps-to", str(shared / "lib"), *extra, "--check"]
    for argv in ([a for a in check if a not in extra], check):  # without digests (nothing named), then with
        subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_own_temp(tmp_path))
        assert not marker.exists(), marker.read_text()
    (wheels / f"{good.name}.000").chmod(0o666)
    other_user.run("import sys; open(sys.argv[1], 'wb').write(open(sys.argv[2], 'rb').read())",
                   str(wheels / f"{good.name}.000"), str(planted))  # she swaps the shipped piece
    fresh = tmp_path / "private" / "lib"
    fresh.parent.mkdir(mode=0o700)
    out = subprocess.run([*check[:5], str(fresh), *check[6:]], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env=_own_temp(tmp_path))
    lines = out.stderr.splitlines()
    assert out.returncode == 3 and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"nni-agent: the shipped file {good.name} ({wheels}/{good.name}.000) is not the one "
                               "the manager shipped"), lines
    assert not marker.exists() and not fresh.exists()


def _own_temp(tmp_path: Path) -> dict[str, str]:
    """The environment, with TMPDIR the test's own: where the boot step unpacks when the shared place
    is not safe (its reusable copy would else stay in /tmp)."""
    import os

    return {**os.environ, "TMPDIR": str(tmp_path)}


def _traversable(path: Path) -> None:
    """Let other users reach `path` (an emulator's own temporary directories, 0700 by default)."""
    for p in [path, *path.parents]:
        if p == Path("/tmp") or p == Path("/"):
            break
        p.chmod(p.stat().st_mode | 0o001)


def test_openpai_storage_files_planted_by_another_user_never_run(other_user: OtherUser, pai_factory, base: Path,
                                                                shared_dir: Callable[[str], Path],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user of the job's storage pre-creates `nni-agent/` there with her
    `nni_agent-<tag>.whl` (the tag is computable from the public agent). The manager refuses the
    directory she owns in one line at start; no job runs her wheel."""
    from nni_manager.backends.agent_wheel import build_agent_wheel
    from nni_manager.backends.base import BackendError
    from nni_manager.service import create_training_service
    from tests.support.manager.helpers import form, wait_status
    from tests.support.openpai.experiments import config, run

    monkeypatch.setenv(agent_deps.CACHE_ENV, str(base / "cache"))
    monkeypatch.setenv(agent_deps.DOWNLOAD_ENV, "0")  # the agent wheel is what matters here
    pai = pai_factory(rate_limits={"list": 0})
    storage = pai.storage_dir("confignfs")
    storage.mkdir(parents=True, exist_ok=True)
    _traversable(storage)
    storage.chmod(0o777)  # a storage every user of the cluster may write
    tag = build_agent_wheel(base / "wheel").tag
    marker = base / "planted-ran"
    planted = planted_wheel(shared_dir("nni-plant-") / "planted.whl", marker)
    planted.chmod(0o644)
    other_user.run(_PLANT, str(planted), f"{storage}/nni-agent", f"nni_agent-{tag}.whl")
    cfg = config(pai, base, {"storageConfigName": "confignfs", "localStorageMountPoint": str(storage),
                             "containerStorageMountPoint": "/mnt/confignfs"})

    async def experiment() -> str:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "SUCCEEDED", "FAILED", timeout=90)
            return f"{d.status.value} {d.message}"

    refused = ""
    try:
        run(experiment())
    except BackendError as e:
        refused = str(e)
    assert not marker.exists(), marker.read_text()
    assert refused.startswith(f"{storage}/nni-agent in the storage is not your directory (owner uid "
                              f"{other_user.uid})"), refused
    assert "\n" not in refused and "Fix: " in refused


MALLORY = "mallory-configmaps-only"  # a ServiceAccount's bearer token on the emulator


def _configmap_only_account(kube: Any) -> Any:
    """ServiceAccount `mallory` whose only Role is every verb on ConfigMaps in `default` (what a
    namespace's admin gives a team's tooling); returns a CoreV1Api acting as her."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    rbac = client.RbacAuthorizationV1Api(kube.api_client())
    rbac.create_namespaced_role("default", {"metadata": {"name": "configmap-editor"}, "rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]})
    rbac.create_namespaced_role_binding("default", {
        "metadata": {"name": "mallory-configmaps"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-editor"},
        "subjects": [{"kind": "ServiceAccount", "name": "mallory", "namespace": "default"}]})
    core = kube.core(token=MALLORY)
    with pytest.raises(ApiException) as denied:
        core.list_namespaced_secret("default")
    assert denied.value.status == 403  # ConfigMaps only: no Secrets, no pods
    return core


def _replace_wheels(core: Any, names: list[str], planted: bytes) -> list[str]:
    """As mallory: delete each ConfigMap and make it again under its name, every wheel entry that is
    a whole wheel (`<wheel>` or a one-piece `<wheel>.000`) swapped for `planted`, the rest kept."""
    swapped = []
    for name in names:
        cm = core.read_namespaced_config_map(name, "default")
        binary = dict(cm.binary_data or {})
        hit = [k for k in binary if k.endswith(".whl") or k.endswith(".whl.000") and f"{k[:-4]}.001" not in binary]
        if not hit:
            continue
        for k in hit:
            binary[k] = base64.b64encode(planted).decode()
        core.delete_namespaced_config_map(name, "default")
        core.create_namespaced_config_map("default", {
            "metadata": {"name": name, "labels": dict(cm.metadata.labels or {})},
            "data": dict(cm.data or {}), "binaryData": binary})  # mutable, as she likes it
        swapped += hit
    return swapped


def test_kubernetes_configmaps_replaced_by_a_configmap_only_account_never_run(
        kube_factory, short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user who may only edit ConfigMaps replaces, between two trials, the experiment's agent
    ConfigMap with one holding her wheel (delete and create: `immutable` does not stop that): the
    next trial's pod refuses the wheel in one line naming it. She then replaces the shared
    dependency ConfigMaps that outlive the experiment: the next experiment replaces them with
    verified ones and SUCCEEDS. Her code never runs, nor can it read the agent's token."""
    from nni_manager.service import create_training_service
    from tests.support.images import SLIM_IMAGE
    from tests.support.kube.harness import config, pods_service
    from tests.support.manager.helpers import form, wait_status

    if not any(WHEELHOUSE.glob("grpcio-*.whl")):
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(short_dir / "wheel-cache"))
    kube = kube_factory(tokens=[f"{MALLORY}=system:serviceaccount:default:mallory:rbac"])
    mallory = _configmap_only_account(kube)
    marker = short_dir / "planted-ran"
    planted = planted_wheel(short_dir / "planted.whl", marker).read_bytes()
    cfg = config(kube, short_dir, pods_service(dockerImage=SLIM_IMAGE, reuseMode=False), agentWheelhouse=str(WHEELHOUSE))

    def ours(deps: bool) -> list[str]:
        return [c.metadata.name for c in mallory.list_namespaced_config_map("default").items
                if c.metadata.name.startswith("nni-agent-") and c.metadata.name.startswith("nni-agent-deps-") == deps]

    async def first() -> str:
        async with create_training_service(cfg) as ts:
            t1 = await ts.submit_trial_job(form(0))
            d1 = await wait_status(ts, t1.id, "SUCCEEDED", "FAILED", timeout=90)
            assert d1.status.value == "SUCCEEDED", d1.message
            swapped = await asyncio.to_thread(_replace_wheels, mallory, ours(deps=False), planted)
            assert [s for s in swapped if s.startswith("nni_agent-")], swapped  # the experiment's agent wheel
            t2 = await ts.submit_trial_job(form(1))
            d2 = await wait_status(ts, t2.id, "SUCCEEDED", "FAILED", timeout=90)
            return f"{d2.status.value} {d2.message}"

    second_trial = run_bounded(first(), 240)
    assert not marker.exists(), marker.read_text()
    status, _, message = second_trial.partition(" ")
    assert status == "FAILED" and "(exit 3): nni-agent: the shipped file nni_agent-" in message, second_trial
    assert "is not the one the manager shipped" in message and "\n" not in message

    assert len(_replace_wheels(mallory, ours(deps=True), planted)) >= 2  # the shared dependency ConfigMaps

    async def again() -> str:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "SUCCEEDED", "FAILED", timeout=90)
            return f"{d.status.value} {d.message}"

    assert run_bounded(again(), 240) == "SUCCEEDED "
    assert not marker.exists(), marker.read_text()
    deps = [c for c in mallory.list_namespaced_config_map("default", label_selector="app=nni-agent-deps").items]
    assert deps and all(c.immutable for c in deps)  # hers were replaced by the manager's own


def test_aml_code_version_planted_by_another_identity_is_refused_and_never_runs(
        aml_factory, azurite, base: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    """Mallory, another member of the workspace (her own Azure identity), creates the code version
    `nni-agent:<hash>` first (the hash is computable from the public agent and wheels), naming a
    folder of her wheels. The manager compares the version with what it ships, refuses it in one
    console line naming it and the fix, and creates its own under the next name; the trial
    SUCCEEDS with the manager's code, and a second experiment reuses that version. Her code never
    runs. (Before: the manager took the version by its name, and every job failed at its boot step.)"""
    import ssl
    import urllib.request

    from azure.identity import AzureCliCredential
    from azure.storage.blob import ContainerClient

    from nni_manager import cli, notices
    from nni_manager.backends import aml_code
    from nni_manager.loader import load_config
    from nni_manager.service import create_training_service
    from tests.support.aml.datastore import code_asset_aml, new_container
    from tests.support.aml.experiments import config_dict, ours, run
    from tests.support.images import SLIM_IMAGE
    from tests.support.manager.helpers import form, wait_status
    from tests.support.storage.fixtures import AZURITE_ACCOUNT, AZURITE_KEY

    if not any(WHEELHOUSE.glob("grpcio-*cp311*.whl")):
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(base / "wheel-cache"))
    monkeypatch.setenv(agent_deps.DOWNLOAD_ENV, "0")
    monkeypatch.setattr(notices, "_said", set())
    container = new_container(azurite)
    aml = code_asset_aml(aml_factory, azurite, monkeypatch, container,
                         principals={"default": ["Contributor"], "mallory": ["Contributor"]})
    files = aml_code.gather(base / "mallory-wheel", WHEELHOUSE)  # what the victim's manager will name
    marker = base / "planted-ran"
    planted = planted_wheel(base / "planted.whl", marker).read_bytes()
    folder = "LocalUpload/mallory/nni-agent"
    with ContainerClient(azurite, container, credential={"account_name": AZURITE_ACCOUNT,
                                                         "account_key": AZURITE_KEY}) as cc:
        for name, _ in files.files:
            cc.upload_blob(f"{folder}/{name}", planted)
    with monkeypatch.context() as m:  # Mallory's own login
        m.setenv("AZURE_CONFIG_DIR", aml.config_dir("mallory"))
        token = AzureCliCredential().get_token("https://management.azure.com/.default").token
    ds = f"{aml.url}{aml.workspace_path}/datastores/workspaceblobstore?api-version=2024-04-01"
    ctx = ssl.create_default_context(cafile=aml.ca_file)
    with urllib.request.urlopen(urllib.request.Request(ds, headers={"Authorization": f"Bearer {token}"}),
                                context=ctx, timeout=30) as r:
        props = json.loads(r.read())["properties"]
    canonical = f"{props.get('protocol') or 'https'}://{AZURITE_ACCOUNT}.blob.{props.get('endpoint') or 'core.windows.net'}"
    version = f"{aml.url}{aml.workspace_path}/codes/nni-agent/versions/{files.digest}?api-version=2024-04-01"
    put = urllib.request.Request(
        version, method="PUT", data=json.dumps({"properties": {"codeUri": f"{canonical}/{container}/{folder}"}}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(put, context=ctx, timeout=30) as r:
        assert r.status in (200, 201)
        assert json.loads(r.read())["systemData"]["createdBy"] == "mallory@contoso.example"
    cfg = load_config({**config_dict(aml, base, dockerImage=SLIM_IMAGE, blobEndpoint=azurite),
                       "agentWheelhouse": str(WHEELHOUSE)})
    cli._console_notices(cfg)  # as `nni-manager run` does

    async def experiment() -> str:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "SUCCEEDED", "FAILED", timeout=90)
            assert d.status.value == "SUCCEEDED", d.message
            return ts.experiment_id

    try:
        first = run(experiment())
        second = run(experiment())
    finally:
        for h in [h for h in notices.log.handlers if getattr(h, "nni_console", False)]:
            notices.log.removeHandler(h)
    assert not marker.exists(), marker.read_text()
    said = [line for line in capsys.readouterr().err.splitlines() if "nni-agent:" in line]
    assert len(said) == 2 and said[0] == said[1], said  # one line on the console, once per experiment
    assert f"the code version nni-agent:{files.digest} " in said[0] and folder in said[0], said
    assert "Fix: find out who created it and delete it" in said[0], said
    code_ids = {aml.job(j["name"])["codeId"] for j in ours(aml, first) + ours(aml, second)}
    assert code_ids == {f"{aml.workspace_path}/codes/nni-agent/versions/{files.digest}-2"}, code_ids
    puts = [r for r in aml.requests() if r.get("kind") == "codes.versions.put"]
    assert len(puts) == 2, puts  # hers, and the manager's once: the second experiment reused its own


def test_aml_code_asset_files_changed_in_the_datastore_are_uploaded_again_and_never_run(
        aml_factory, azurite, base: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    """The manager's own code version exists, but someone who may write the datastore's container
    (its account key) replaced the agent wheel under the version's folder. The next experiment
    reads the folder back, finds the file is not what it uploaded, says so once on the console and
    uploads its own again: the trial SUCCEEDS with the manager's code, and hers never runs.
    (Before: the version was reused by its name and every job failed at its boot step.)"""
    from azure.storage.blob import ContainerClient

    from nni_manager import cli, notices
    from nni_manager.loader import load_config
    from nni_manager.service import create_training_service
    from tests.support.aml.datastore import code_asset_aml, new_container
    from tests.support.aml.experiments import config_dict, ours, run
    from tests.support.images import SLIM_IMAGE
    from tests.support.manager.helpers import form, wait_status
    from tests.support.storage.fixtures import AZURITE_ACCOUNT, AZURITE_KEY

    if not any(WHEELHOUSE.glob("grpcio-*cp311*.whl")):
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(base / "wheel-cache"))
    monkeypatch.setenv(agent_deps.DOWNLOAD_ENV, "0")
    monkeypatch.setattr(notices, "_said", set())
    container = new_container(azurite)
    aml = code_asset_aml(aml_factory, azurite, monkeypatch, container)
    cfg = load_config({**config_dict(aml, base, dockerImage=SLIM_IMAGE, blobEndpoint=azurite),
                       "agentWheelhouse": str(WHEELHOUSE)})
    cli._console_notices(cfg)  # as `nni-manager run` does

    async def experiment() -> str:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "SUCCEEDED", "FAILED", timeout=90)
            assert d.status.value == "SUCCEEDED", d.message
            return ts.experiment_id

    marker = base / "planted-ran"
    planted = planted_wheel(base / "planted.whl", marker).read_bytes()
    try:
        first = run(experiment())
        with ContainerClient(azurite, container, credential={"account_name": AZURITE_ACCOUNT,
                                                             "account_key": AZURITE_KEY}) as cc:
            wheel = next(b.name for b in cc.list_blobs() if "/nni_agent-" in b.name and "/deps/" not in b.name)
            cc.upload_blob(wheel, planted, overwrite=True)
        second = run(experiment())
    finally:
        for h in [h for h in notices.log.handlers if getattr(h, "nni_console", False)]:
            notices.log.removeHandler(h)
    assert not marker.exists(), marker.read_text()
    said = [line for line in capsys.readouterr().err.splitlines() if "code asset" in line]
    assert len(said) == 1, said
    assert wheel in said[0] and "were not what nni-manager uploaded" in said[0] and "Fix: " in said[0], said
    with ContainerClient(azurite, container, credential={"account_name": AZURITE_ACCOUNT,
                                                         "account_key": AZURITE_KEY}) as cc:
        assert cc.download_blob(wheel).readall() != planted  # the manager's own again
    assert len({aml.job(j["name"])["codeId"] for j in ours(aml, first) + ours(aml, second)}) == 1
