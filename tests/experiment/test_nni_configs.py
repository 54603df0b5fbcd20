"""A sweep over NNI's own experiment configs (copies in nni_configs/, see its README): every config
loads, except those NNI 3.0 itself refuses (each refused naming the reason, as NNI does) and
sharedStorage (being built); any other refusal fails the sweep."""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from nni_manager.config import ConfigError
from nni_manager.loader import load_config

SOURCE = Path(__file__).parent / "nni_configs"
TEMPLATES = {"examples/trials/mnist-pytorch/fc_template.yml"}  # a config's FrameworkController template (configPath)
CONFIGS = sorted(str(p.relative_to(SOURCE)) for p in SOURCE.rglob("*.yml") if str(p.relative_to(SOURCE)) not in TEMPLATES)

# config -> the words its refusal must contain (features or platforms not here)
REFUSED = {
    # NNI's own error: email/password/team come from DLTS's job variables when not in dltsConfig
    "examples/trials/mnist-tfv1/config_dlts.yml": "`email` field in `dltsConfig` is not configured.",
    # NNI's own refusals: a template with blank fields (NNI 3.0: "K8sStorageConfig: type of
    # storage_type (None) is not <class 'str'>"), and an adl config with no image (nnictl's
    # schema: "Key 'trial' error: Missing key: 'image'")
    "examples/trials/mnist-tfv2/config_hybrid.yml": "trainingService[3].storage.storageType`: is required",
    "test/training_service/config/examples/cifar10-pytorch-adl.yml": "trainingService.image`: is required",
    # `password: 12345` unquoted is a YAML integer; NNI's typeguard check refuses it too
    "examples/trials/mnist-pytorch/config_remote.yml": "machineList[1].password`: must be a non-empty string",
    "examples/trials/mnist-tfv2/config_remote.yml": "machineList[1].password`: must be a non-empty string",
    "examples/trials/mnist-sharedstorage/config_nfs.yml": "machineList[1].password`: must be a non-empty string",
    "examples/trials/mnist-sharedstorage/config_azureblob.yml": "machineList[1].password`: must be a non-empty string",
}
# `useAnnotation: true`: the search space comes from the trial code, so its code folder gets an
# annotated trial in the style of NNI's examples/trials/mnist-annotation
ANNOTATED = {
    "test/training_service/config/tuners/anneal.yml", "test/training_service/config/tuners/evolution.yml",
    "test/training_service/config/tuners/random.yml", "test/training_service/config/tuners/smac.yml",
    "test/training_service/config/tuners/tpe.yml",
}
ANNOTATED_TRIAL = '''
def main(batch_num):
    """@nni.get_next_parameter()"""
    """@nni.variable(nni.choice(2, 3, 5, 7), name=conv_size)"""
    conv_size = 5
    """@nni.variable(nni.uniform(0.0001, 0.1), name=learning_rate)"""
    learning_rate = 1e-4
    """@nni.report_final_result(conv_size * learning_rate)"""
'''

_STORAGE_PLACEHOLDERS = {
    "${your/local/mount/point}": "TMP/storage", "${your/remote/mount/point}": "/mnt/nni-storage",
    "${nfs-server-ip}": "10.0.0.2",  # not dialed: data only
    "${nfs/exported/directory}": "/srv/nfs/nni", "${replace_to_your_storageAccountName}": "nniaccount",
    "${replace_to_your_storageAccountKey}": "bm5pLWtleQ==", "${replace_to_your_containerName}": "nni",
}
_PLACEHOLDER = re.compile(r"\$?\{(your|replace)[^}]*\}")


ALGORITHM_SECTIONS = ("tuner", "assessor", "advisor")


def _algorithm_dirs_under(root: Path, text: str) -> str:
    """An algorithm's absolute `codeDir` (opevo's `/root/algorithms/`) is a folder of this machine,
    which the loader checks: it becomes the same path under `root`, made here, so the sweep never
    depends on what happens to exist on the machine running it."""
    data = yaml.safe_load(text) or {}
    for section in ALGORITHM_SECTIONS:
        for key in ("codeDir", "codeDirectory"):
            value = (data.get(section) or {}).get(key)
            if isinstance(value, str) and value.startswith("/"):
                moved = root / value.lstrip("/")
                moved.mkdir(parents=True, exist_ok=True)
                text = re.sub(rf"(\b{key}:[ \t]*){re.escape(value)}([ \t]*$)",
                              lambda m, moved=moved: m.group(1) + str(moved) + m.group(2), text, flags=re.M)
    return text


def _prepare(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy as a user would have it: placeholders filled in, code folders and SSH key present."""
    shutil.copytree(SOURCE, tmp_path / "c")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("not a real key: the config is only loaded\n")
    monkeypatch.setenv("HOME", str(home))
    for var in ("DLWS_USER_EMAIL", "DLTS_JOB_TOKEN", "DLWS_VC_NAME"):
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "c" / name
    text = path.read_text()
    for placeholder, value in _STORAGE_PLACEHOLDERS.items():  # sharedStorage's own placeholders
        text = text.replace(placeholder, value.replace("TMP", str(tmp_path)))
    text = _PLACEHOLDER.sub("10.0.0.1", text)  # not dialed: data only
    text = _algorithm_dirs_under(tmp_path / "fs", text)
    path.write_text(text)

    def make_dirs(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("trialCodeDirectory", "codeDir", "codeDirectory") and isinstance(value, str):
                    if not value.startswith("/"):  # absolute: a folder in an image (adl), never made here
                        (path.parent / value).expanduser().mkdir(parents=True, exist_ok=True)
                else:
                    make_dirs(value)
        elif isinstance(node, list):
            for item in node:
                make_dirs(item)

    data = yaml.safe_load(text)
    make_dirs(data)
    if data.get("useAnnotation"):
        (path.parent / data["trial"]["codeDir"] / "mnist.py").write_text(ANNOTATED_TRIAL)
    return path


def test_the_sample_is_representative() -> None:
    assert len(CONFIGS) >= 45
    text = "\n".join((SOURCE / c).read_text() for c in CONFIGS)
    for words in ("TPE", "Medianstop", "Curvefitting", "Hyperband", "BOHB", "className", "builtinTunerName",
                  "platform: remote", "kubeflow", "frameworkcontroller"):
        assert words in text, words


def test_the_annotated_ones_are_those_using_annotations() -> None:
    assert {c for c in CONFIGS if (yaml.safe_load((SOURCE / c).read_text()) or {}).get("useAnnotation")} == ANNOTATED


@pytest.mark.parametrize("name", CONFIGS)
def test_nni_config(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _prepare(tmp_path, name, monkeypatch)
    if name in REFUSED:
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert REFUSED[name] in str(info.value)
        return
    config = load_config(path)
    assert config.tuner is not None and (config.tuner.name or config.tuner.class_name)
    assert config.search_space
    if name in ANNOTATED:
        assert config.use_annotation and set(config.search_space) == {
            "mnist/conv_size/choice", "mnist/learning_rate/uniform"}
    assert config.trial_concurrency >= 1
    if "sharedstorage" in name:  # NNI's shared-storage configs: every field as NNI reads it
        storage = config.shared_storage
        assert storage is not None and storage.local_mounted == "nnimount"
        assert storage.local_mount_point == tmp_path / "storage" and storage.remote_mount_point == "/mnt/nni-storage"
        if storage.storage_type == "NFS":
            assert (storage.nfs_server, storage.exported_directory) == ("10.0.0.2", "/srv/nfs/nni")  # not dialed
        else:
            assert (storage.storage_account_name, storage.container_name) == ("nniaccount", "nni")
            assert storage.storage_account_key == "bm5pLWtleQ==" and "bm5pLWtleQ==" not in repr(config)


def test_an_absolute_algorithm_folder_is_made_under_the_test_s_own_root(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """opevo's tuner lives in `/root/algorithms/`: the sweep loads it from a folder it made itself,
    never from whatever this machine happens to hold at that path."""
    name = "examples/trials/systems_auto_tuning/opevo/src/experiments/mm/N512K1024M1024/config_opevo.yml"
    assert "codeDir: /root/algorithms/" in (SOURCE / name).read_text()
    config = load_config(_prepare(tmp_path, name, monkeypatch))
    assert config.tuner is not None and config.tuner.class_name == "opevo.OpEvo"
    assert config.tuner.code_directory == tmp_path / "fs" / "root" / "algorithms"


def test_an_unfilled_placeholder_is_named_as_one(tmp_path: Path) -> None:
    """NNI's config_adl.yml as shipped: `nniManagerIp: {replace_with_your_ip}` is a YAML mapping;
    the error says it is a placeholder (its codeDir, a folder of the image, is never looked at)."""
    shutil.copytree(SOURCE / "examples" / "trials" / "mnist-pytorch", tmp_path / "c")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "c" / "config_adl.yml")
    assert info.value.field == "nniManagerIp"
    assert "`{replace_with_your_ip}`, a placeholder" in str(info.value), str(info.value)


def test_adl_code_directory_is_a_folder_of_the_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _prepare(tmp_path, "examples/trials/cifar10_pytorch/config_adl.yml", monkeypatch)
    config = load_config(path)
    assert config.training_service.platform == "adl" and str(config.trial_code_directory) == "/cifar10"
    assert not Path("/cifar10").exists()  # never made nor looked for on this machine
