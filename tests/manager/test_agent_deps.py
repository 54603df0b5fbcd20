"""The manager's resolver for wheels of the agent's dependencies: the worker's tags decide,
the newest version in range wins, requirements are followed (markers for the worker's Python),
and a gap is one error naming the requirement and the fix."""
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from nni_manager.backends import agent_deps
from nni_manager.backends.agent_deps import DependencyError, WorkerPython

PY38 = WorkerPython((3, 8), "x86_64", (2, 28))


def wheel(where: Path, filename: str, requires: tuple[str, ...] = ()) -> Path:
    name, version = filename.split("-")[:2]
    path = where / filename
    with zipfile.ZipFile(path, "w") as zf:
        meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
        zf.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}")
    return path


def names(wheels: agent_deps.Wheels) -> list[str]:
    return sorted(f.name for f in wheels.files)


def test_the_workers_tags_and_the_range_decide(tmp_path: Path) -> None:
    house = tmp_path / "house"
    house.mkdir()
    wheel(house, "grpcio-1.70.0-cp38-cp38-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    wheel(house, "grpcio-1.85.3-cp311-cp311-manylinux2014_x86_64.whl")  # another Python
    wheel(house, "grpcio-1.71.0-cp38-cp38-manylinux_2_34_x86_64.whl")  # newer glibc than the worker's
    wheel(house, "grpcio-1.69.0-cp38-cp38-manylinux2014_aarch64.whl")  # another machine
    wheel(house, "grpcio-2.0.0-cp38-cp38-manylinux2014_x86_64.whl")  # out of range
    wheel(house, "psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.whl")  # abi3 fits every later CPython
    got = agent_deps.resolve(PY38, house, requirements=["grpcio>=1.49.1,<2", "psutil>=5.9.4,<8"],
                             allow_download=False, cache=tmp_path / "cache")
    assert names(got) == ["grpcio-1.70.0-cp38-cp38-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
                          "psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.whl"]
    assert all(f.parent == tmp_path / "cache" for f in got.files)  # copied into the cache for next time


def test_requirements_are_followed_with_the_workers_markers(tmp_path: Path) -> None:
    house = tmp_path / "house"
    house.mkdir()
    wheel(house, "grpcio-1.80.0-cp38-cp38-manylinux2014_x86_64.whl",
          requires=("typing-extensions>=4.12", "futures; python_version < '3.0'", "extra-thing; extra == 'all'"))
    wheel(house, "typing_extensions-4.16.0-py3-none-any.whl")
    got = agent_deps.resolve(PY38, house, requirements=["grpcio"], allow_download=False, cache=tmp_path / "c")
    assert names(got) == ["grpcio-1.80.0-cp38-cp38-manylinux2014_x86_64.whl", "typing_extensions-4.16.0-py3-none-any.whl"]


def test_a_gap_is_one_error_with_the_fix(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DependencyError) as info:
        agent_deps.resolve(WorkerPython((3, 8), "aarch64", (2, 17)), empty, requirements=["protobuf>=4.25.1,<8"],
                           allow_download=False, cache=tmp_path / "c")
    text = str(info.value)
    assert "no wheel for protobuf<8,>=4.25.1" in text and "Python 3.8 on aarch64 (glibc 2.17)" in text
    assert "agentWheelhouse" in text and "--platform manylinux2014_aarch64" in text


def test_a_worker_without_glibc_gets_only_pure_wheels(tmp_path: Path) -> None:
    musl = WorkerPython((3, 11), "x86_64", None)
    house = tmp_path / "house"
    house.mkdir()
    wheel(house, "psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.whl")
    wheel(house, "nvidia_ml_py-13.615.71-py3-none-any.whl")
    got = agent_deps.resolve(musl, house, requirements=["nvidia-ml-py"], allow_download=False, cache=tmp_path / "c")
    assert names(got) == ["nvidia_ml_py-13.615.71-py3-none-any.whl"]
    with pytest.raises(DependencyError):
        agent_deps.resolve(musl, house, requirements=["psutil"], allow_download=False, cache=tmp_path / "c")
