"""NNI's default image, `msranni/nni:latest`, as it really is (issue 19, item 4): Python 3.8 with
`nni` (and so psutil) but neither grpcio nor protobuf. NNI's own FrameworkController example config
runs unchanged but for what every user fills in (the cluster, the NFS placeholders); the manager
probes the image, downloads cp38 wheels (`pip download` through the package index) and ships them
in ConfigMaps; the trial is NNI trial code (`import nni`) run by the image's own Python."""
from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from nni_manager.backends import agent_deps
from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.manager.helpers import form, wait_status
from tests.support.nni_image import nni_latest_bin
from tests.support.bounded import run_bounded

NNI_EXAMPLE = Path(__file__).parents[1] / "experiment/nni_configs/examples/trials/mnist-pytorch"
NFS_SERVER = "nfs.example.org"  # not dialed: the emulator's kubelet backs the export with a directory
# NNI's mnist.py in small: the same SDK calls, no dataset
MNIST_STANDIN = r'''
import sys
import nni
params = nni.get_next_parameter()
for epoch in range(2):
    nni.report_intermediate_result(params["lr"] * epoch)
print("python", "%d.%d" % sys.version_info[:2], flush=True)
nni.report_final_result(params["lr"])
'''


@pytest.fixture(scope="module")
def nni_image_bin() -> str:
    found, why = nni_latest_bin()
    if found is None:
        pytest.skip(why)
    return found


def test_nni_frameworkcontroller_example_on_the_real_default_image(kube_factory, nni_image_bin: str,
                                                                   short_dir: Path, monkeypatch) -> None:
    image_py = Path(nni_image_bin) / "python"
    probe = subprocess.run([str(image_py), "-c", "import sys, nni, psutil; print('%d.%d' % sys.version_info[:2]);"
                            "import importlib.util as u; print(u.find_spec('grpc'), u.find_spec('google'))"],
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.split() == ["3.8", "None", "None"], probe  # the image as NNI ships it
    # the manager's wheel cache (and probe cache) is this test's own, and empty: other tests expect
    # no wheels; downloads are on, as for users (tests/conftest.py turns them off elsewhere)
    cache = short_dir / "wheel-cache"
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(cache))
    monkeypatch.setenv(agent_deps.DOWNLOAD_ENV, "1")
    monkeypatch.setenv("HOME", str(short_dir))  # ~/nni-experiments
    kube = kube_factory(crd_groups=["frameworkcontroller.microsoft.com"], nodes=["node-1=8,16384,1"],
                        images={"msranni/nni:latest": nni_image_bin})
    example = short_dir / "mnist-pytorch"
    example.mkdir()
    for name in ("config_frameworkcontroller.yml", "search_space.json"):
        shutil.copy(NNI_EXAMPLE / name, example / name)
    (example / "mnist.py").write_text(MNIST_STANDIN)
    path = example / "config_frameworkcontroller.yml"
    data = yaml.safe_load(path.read_text())
    assert data["trial"]["taskRoles"][0]["image"] == "msranni/nni:latest"
    fc = data["frameworkcontrollerConfig"]
    fc["kubeConfig"] = str(kube.kubeconfig)  # which cluster, and the placeholders NNI asks users to fill
    fc["nfs"] = {"server": NFS_SERVER, "path": "/var/nfs/nni"}
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)

    async def body() -> None:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0, lr=0.02, momentum=0.5, batch_size=32, hidden_size=128))
            done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", timeout=240)
            assert done.status.value == "SUCCEEDED", done.message
            out = "".join(p.read_text() for p in (ts.experiment_dir / "trials" / job.id).rglob("trial.stdout"))
            assert "python 3.8" in out, out  # NNI's SDK in the image's own Python 3.8

    run_bounded(body(), 420)
    shipped = kube.core().list_namespaced_config_map("default", label_selector="app=nni-agent-deps").items
    assert shipped, "no dependency ConfigMaps: the image's lack of grpcio / protobuf went unnoticed"
    (key,) = [d.name for d in cache.iterdir() if d.is_dir()]
    assert key.startswith("cp38-x86_64-glibc"), key
    wheels = sorted(p.name for p in (cache / key).glob("*.whl"))
    assert any(w.startswith("grpcio-") and "-cp38-cp38-" in w for w in wheels), wheels  # downloaded for 3.8
    assert any(w.startswith("protobuf-") for w in wheels), wheels
    total = sum(len(base64.b64decode(v)) for c in shipped for v in (c.binary_data or {}).values())
    print(f"shipped {len(shipped)} ConfigMaps, {total / 1e6:.1f} MB of cp38 wheels: {wheels}")
