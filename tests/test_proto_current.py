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
    """Each backend (a module or a package under backends/) uses only the shared pieces."""
    backends = ROOT / "manager" / "nni_manager" / "backends"
    shared = {"__init__", "base", "registry", "agent_wheel", "agent_command", "agent_deps", "rest_jobs", "jobs"}  # shared
    units = {p.stem: [p] for p in backends.glob("*.py") if p.stem not in shared}
    units |= {d.name: sorted(d.rglob("*.py")) for d in backends.iterdir() if (d / "__init__.py").is_file()}
    assert {"local", "remote", "kubernetes", "slurm"} <= set(units)
    offenders = [f"{f.relative_to(backends)} imports {other}" for name, files in units.items() for f in files
                 for other in units if other != name and f"backends.{other}" in f.read_text()]
    assert offenders == []
