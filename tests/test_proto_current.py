"""The committed protobuf code must be what scripts/gen_proto.py makes from proto/."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_protobuf_code_is_current():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "current" in result.stdout


def test_agent_package_never_imports_the_manager():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "agent").rglob("*.py")
                 if "nni_manager" in p.read_text()]
    assert offenders == []


def test_backends_never_import_each_other():
    backends = ROOT / "manager" / "nni_manager" / "backends"
    names = {p.stem for p in backends.glob("*.py")} - {"__init__", "base", "registry"}
    offenders = [f"{p.name} imports {other}" for p in backends.glob("*.py") for other in names
                 if other != p.stem and p.stem not in ("registry",)
                 and f"backends.{other}" in p.read_text()]
    assert offenders == []
