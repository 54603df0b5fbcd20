"""Each platform page opens with a complete config, included from the file beside it, and that
config passes `nni-manager run --dry-run` as pasted (only the placeholders a user must fill in,
such as tokens, replaced)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.dry_run import KUBECONFIG

ROOT = Path(__file__).resolve().parents[2]
PLATFORMS = ROOT / "docs" / "platforms"
NOT_PLATFORMS = ("index", "shared-storage")  # an overview and a feature, not platforms
PLACEHOLDERS = {"<application token>": "t0ken", "<job token>": "t0ken", "<subscription>": "sub", "<secret>": "s3cret"}
INCLUDE = re.compile(r'```yaml\n--8<-- "platforms/([\w-]+\.yml)"\n```')


def _pages() -> list[Path]:
    return [p for p in sorted(PLATFORMS.glob("*.md")) if p.stem not in NOT_PLATFORMS]


def test_every_platform_page_opens_with_its_config_file() -> None:
    for page in _pages():
        text = page.read_text()
        first_block = text.index("```")
        found = INCLUDE.match(text, first_block)
        assert found is not None, f"{page.name}: the first code block is not its complete config"
        assert found.group(1) == f"{page.stem}.yml" and (PLATFORMS / found.group(1)).is_file()
        assert first_block < text.index("\n## "), f"{page.name}: the config comes after a section"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.stem)
def test_platform_page_config_passes_dry_run_as_pasted(page: Path, tmp_path: Path) -> None:
    text = (PLATFORMS / f"{page.stem}.yml").read_text()
    for placeholder, value in PLACEHOLDERS.items():
        text = text.replace(placeholder, value)
    (tmp_path / "config.yml").write_text(text)
    (tmp_path / "train.py").write_text("print('training')\n")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("key\n")  # the configs' sshKeyFile (not read by a dry run)
    (home / ".kube").mkdir()
    (home / ".kube" / "config").write_text(KUBECONFIG)  # a user with a cluster has one (a dry run dials nothing)
    done = subprocess.run([sys.executable, "-m", "nni_manager", "run", "config.yml", "--dry-run"], cwd=tmp_path,
                          env={**os.environ, "HOME": str(home)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the dry run printed nothing"


# what a user reads before the internals: the requirements and the config
USER_FACING = {"Prerequisites", "What the image needs", "Config"}


def test_every_platform_page_keeps_its_internals_under_how_it_works() -> None:
    for page in [*_pages(), PLATFORMS / "shared-storage.md"]:
        heads = re.findall(r"^## (.+)$", page.read_text(), re.M)
        assert "How it works" in heads, f"{page.name}: no 'How it works' section"
        before = heads[:heads.index("How it works")]
        assert set(before) <= USER_FACING, f"{page.name}: {before} come before 'How it works'"
        assert "Troubleshooting" not in before, page.name
