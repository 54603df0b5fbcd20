"""Code bundles: .nniignore, NNI's limits with a helpful error, a stable digest."""
from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path

import pytest

from nni_manager import bundle
from nni_manager.bundle import BundleError, pack


def make_code(root: Path) -> Path:
    code = root / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "data").mkdir()
    (code / "train.py").write_text("print('hi')\n")
    (code / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(code / "run.sh", 0o755)
    (code / "pkg" / "mod.py").write_text("X = 1\n")
    (code / "pkg" / "mod.pyc").write_bytes(b"\0" * 10)
    (code / "data" / "big.bin").write_bytes(b"\1" * 1000)
    (code / ".nniignore").write_text("data/\n*.pyc\n")
    return code


def names(path: Path) -> list[str]:
    with tarfile.open(path) as tar:
        return sorted(tar.getnames())


def test_nniignore_honoured_and_modes_kept(tmp_path: Path) -> None:
    b = pack(make_code(tmp_path), tmp_path / "cache")
    assert names(b.path) == [".nniignore", "pkg", "pkg/mod.py", "run.sh", "train.py"]
    with tarfile.open(b.path) as tar:
        assert tar.getmember("run.sh").mode == 0o755
        assert tar.getmember("train.py").mode == 0o644
    assert b.digest == "sha256:" + hashlib.sha256(b.path.read_bytes()).hexdigest()
    assert b.size == b.path.stat().st_size


def test_digest_stable_across_mtimes_and_copies(tmp_path: Path) -> None:
    code = make_code(tmp_path / "one")
    first = pack(code, tmp_path / "cache")
    os.utime(code / "train.py", (1, 1))
    second = pack(code, tmp_path / "cache2")
    other = pack(make_code(tmp_path / "two"), tmp_path / "cache3")
    assert first.digest == second.digest == other.digest
    (code / "train.py").write_text("print('changed')\n")
    assert pack(code, tmp_path / "cache").digest != first.digest
    assert bundle.cached(tmp_path / "cache", first.digest) == first.path
    assert bundle.cached(tmp_path / "cache", "sha256:../../etc") is None


def test_too_many_files_names_offenders(tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "logs").mkdir(parents=True)
    (code / "train.py").write_text("x")
    for i in range(bundle.MAX_FILES + 5):
        (code / "logs" / f"{i}.txt").write_text("x")
    with pytest.raises(BundleError) as err:
        pack(code, tmp_path / "cache")
    text = str(err.value)
    assert f"has {bundle.MAX_FILES + 6} files" in text
    assert f"logs/ ({bundle.MAX_FILES + 5} files" in text
    assert ".nniignore" in text
    (code / ".nniignore").write_text("logs\n")
    assert names(pack(code, tmp_path / "cache").path) == [".nniignore", "train.py"]


def test_too_big_names_largest_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle, "MAX_BYTES", 10_000)
    code = tmp_path / "code"
    (code / "ckpt").mkdir(parents=True)
    (code / "ckpt" / "model.pt").write_bytes(b"\0" * 20_000)
    (code / "train.py").write_text("x")
    with pytest.raises(BundleError, match=r"Largest files: ckpt/model.pt \(0.0 MB\)") as err:
        pack(code, tmp_path / "cache")
    assert "ckpt/ (1 files" in str(err.value)


def test_chunks_reassemble(tmp_path: Path) -> None:
    path = tmp_path / "b.tar.gz"
    path.write_bytes(os.urandom(2500))
    parts = list(bundle.chunks(path, chunk_size=1000))
    assert [(o, len(d), last) for o, d, last in parts] == [(0, 1000, False), (1000, 1000, False), (2000, 500, True)]
    assert b"".join(d for _, d, _ in parts) == path.read_bytes()
    empty = tmp_path / "e"
    empty.write_bytes(b"")
    assert list(bundle.chunks(empty)) == [(0, b"", True)]
