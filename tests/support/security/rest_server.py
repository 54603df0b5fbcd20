"""A stored experiment (fixture `stored`) for tests of the WebUI REST server's security."""
from __future__ import annotations

from pathlib import Path

import pytest

from nni_manager.types import TrialJobStatus
from tests.support.webui.fixtures import Synthetic


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    exp = Synthetic(tmp_path / "exp")
    exp.trial("tAAAA", TrialJobStatus.SUCCEEDED, {"x": 1}, final=0.5)
    exp.store.close()
    return tmp_path / "exp"
