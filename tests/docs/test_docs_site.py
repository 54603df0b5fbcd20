"""The docs site builds with `mkdocs build --strict`: every page in the nav, every internal link valid."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_docs_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install '.[test]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed (pip install '.[test]')")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()
    assert (tmp_path / "site" / "platforms" / "remote" / "index.html").is_file()
    assert "save it as config.yml beside your train.py" in (tmp_path / "site" / "platforms" / "remote" / "index.html").read_text()  # included config


def test_readme_links_resolve():
    """The README's relative links (to docs/ pages) point at files that exist."""
    import re

    readme = (ROOT / "README.md").read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t and not t.startswith("#")]
    assert targets, "the README links to no docs page"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert missing == []



def test_docs_home_repeats_the_readmes_commands():
    """docs/index.md carries the README's "Two commands" and "Using it" sections word for word."""
    readme = (ROOT / "README.md").read_text()
    home = (ROOT / "docs" / "index.md").read_text()
    for heading in ("## Two commands", "## Using it"):
        start = readme.index(heading)
        section = readme[start:readme.index("\n## ", start + 1)]
        assert section in home, f"{heading} differs between README.md and docs/index.md"
