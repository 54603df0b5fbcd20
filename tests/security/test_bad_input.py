"""Bad input gets a clear error, never a traceback: a code directory holding a Unix socket or a
FIFO is packed without them (with a warning, as tar does), and NNI's own invalid
`no-tuner.yml` (an assessor with no tuner) is refused naming the field."""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from nni_manager.bundle import pack
from nni_manager.config import ConfigError
from nni_manager.loader import load_config

# test/ut/tools/nnictl/config_files/invalid/no-tuner.yml of NNI 3.0, as it is there
NNI_NO_TUNER = """\
authorName: nni
experimentName: default_test
maxExecDuration: 15m
maxTrialNum: 2
trialConcurrency: 2
searchSpacePath: ./search_space.json

# error: no tuner or advisor
assessor:
  builtinAssessorName: Medianstop
  classArgs:
    optimize_mode: maximize
trial:
  codeDir: ./
  command: python3 main.py

useAnnotation: false
multiPhase: false
multiThread: false

trainingServicePlatform: local
"""


def test_code_directory_with_socket_and_fifo_packs_without_them(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    code = tmp_path / "c"
    (code / "sub").mkdir(parents=True)
    (code / "trial.py").write_text("print('hi')\n")
    os.mkfifo(code / "sub" / "pipe")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(code / "tb.sock"))  # e.g. a TensorBoard or debugger socket left in the directory
    try:
        with caplog.at_level(logging.WARNING, "nni_manager.bundle"):
            bundle = pack(code, tmp_path / "cache")
    finally:
        listener.close()
    with tarfile.open(bundle.path) as tar:
        assert sorted(tar.getnames()) == ["sub", "trial.py"]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "tb.sock: a socket" in warned and "sub/pipe: a FIFO" in warned


def test_nni_no_tuner_config_is_refused_naming_the_field(tmp_path: Path) -> None:
    (tmp_path / "search_space.json").write_text('{"x": {"_type": "choice", "_value": [1, 2]}}')
    (tmp_path / "main.py").write_text("")
    config = tmp_path / "no-tuner.yml"
    config.write_text(NNI_NO_TUNER)
    with pytest.raises(ConfigError, match="tuner.*must be set"):
        load_config(config)
    out = subprocess.run([sys.executable, "-m", "nni_manager", "run", "--dry-run", str(config)],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "tuner" in out.stderr and "must be set" in out.stderr, out.stderr
