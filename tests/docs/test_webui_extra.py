"""The `webui` extra (what scripts/quickstart.sh installs) provides the WebUI static.py looks for."""
import importlib.util
import re
from pathlib import Path

import pytest

from nni_manager.webui import static

ROOT = Path(__file__).resolve().parents[2]


def test_webui_extra_pins_the_nni_the_server_asks_for():
    block = re.search(r"^webui = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M)
    assert block, "no `webui` extra in pyproject.toml"
    asked = re.search(r"pip install (nni==[\d.]+)", static.NO_WEBUI_PAGE).group(1)
    assert re.findall(r'"([^"]+)"', block.group(1)) == [asked]
    assert "EXTRAS=test,webui" in (ROOT / "scripts" / "quickstart.sh").read_text()


def test_installed_nni_ships_the_webui(monkeypatch):
    if importlib.util.find_spec("nni") is None:  # found, not imported: importing it here costs seconds
        pytest.skip("nni is not installed (pip install '.[webui]')")
    monkeypatch.delenv("NNI_MANAGER_WEBUI_DIR", raising=False)
    found = static.webui_dir()
    assert found is not None and (found / "index.html").is_file()
