"""Runs ON THE WORKER (stdlib only, Python >= 3.8), fed to `python -` over SSH.

argv: <wheel or -> <install dir> <JSON {module: requirement}> [<dir of shipped wheels>].
Unpacks the agent wheel into <dir>/lib (a pure-Python wheel installs by unpacking: no pip, no
index, no deps), unpacks the dependency wheels the manager shipped (if any) into
<dir>/deps-<pyver>, checks that the agent's dependencies import with this Python and have
versions in the agent's ranges (the agent's boot step, nni_agent/boot.py, in check mode),
installs only what is wrong into <dir>/deps-<pyver> with `pip --target` when pip can reach an
index (never touching what the user installed), and records this Python in <dir>/pythons.
Prints one JSON line, with what the manager needs to pick wheels for this Python.
"""
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile

CHECK = """
import importlib, json, sys
bad = {}
for mod in sys.argv[1:] + ["nni_agent.v1.agent_pb2_grpc"]:
    try:
        importlib.import_module(mod)
    except Exception as e:
        bad[mod] = f"{type(e).__name__}: {e}"[:300]
print(json.dumps(bad))
"""


def missing(python_path: str, modules: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=python_path, PYTHONNOUSERSITE="1")
    out = subprocess.run([sys.executable, "-c", CHECK, *modules], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        return {"python": out.stderr.strip()[-300:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def unpack_wheels(wheels: str, deps: str) -> None:
    """Install shipped wheels by unpacking them into `deps` (what pip does for a --target
    install of a wheel: the .data/purelib and platlib trees go to the top; nothing runs)."""
    tmp = tempfile.mkdtemp(prefix=".deps-", dir=os.path.dirname(deps))
    for name in sorted(os.listdir(wheels)):
        if name.endswith(".whl"):
            with zipfile.ZipFile(os.path.join(wheels, name)) as zf:
                for member in zf.namelist():  # the manager's own wheels, still: no escapes
                    if member.startswith("/") or ".." in member.split("/"):
                        raise SystemExit("refusing wheel member %r in %s" % (member, name))
                zf.extractall(tmp)
    for entry in os.listdir(tmp):
        if entry.endswith(".data"):
            for kind in ("purelib", "platlib"):
                tree = os.path.join(tmp, entry, kind)
                for top in os.listdir(tree) if os.path.isdir(tree) else []:
                    os.replace(os.path.join(tree, top), os.path.join(tmp, top))
            shutil.rmtree(os.path.join(tmp, entry))
    if os.path.isdir(deps):
        shutil.rmtree(deps)
    os.rename(tmp, deps)
    shutil.rmtree(wheels, ignore_errors=True)


def glibc() -> str:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or ""  # "glibc 2.36"
    except (ValueError, OSError):
        return ""


def version_check(lib: str, deps: str) -> dict:
    """The agent's boot step in check mode: the dependencies' versions against the agent's ranges
    ({"ok", "problems", "fixes"}: fixes are the requirements pip must bring)."""
    boot = os.path.join(lib, "nni_agent", "boot.py")
    env = dict(os.environ, PYTHONNOUSERSITE="1")
    out = subprocess.run([sys.executable, boot, "--path", lib, "--path", deps, "--where", "the worker", "--check"],
                         env=env, capture_output=True, text=True)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ok": False, "problems": [out.stderr.strip()[-300:] or "the boot check failed"], "fixes": []}


def main() -> None:
    wheel, target, reqs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    shipped = sys.argv[4] if len(sys.argv) > 4 else ""
    lib = os.path.join(target, "lib")
    deps = os.path.join(target, "deps-%d.%d" % sys.version_info[:2])
    if not os.path.isdir(lib) and wheel != "-":  # unpack beside, then rename: concurrent installs are safe
        tmp = tempfile.mkdtemp(prefix=".lib-", dir=target)
        zipfile.ZipFile(wheel).extractall(tmp)
        try:
            os.rename(tmp, lib)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    if wheel != "-":
        os.unlink(wheel)
    if shipped:
        unpack_wheels(shipped, deps)
    path = lib + os.pathsep + deps

    def check() -> tuple:
        bad = missing(path, list(reqs))
        versions: dict = {"ok": True, "problems": [], "fixes": []} if bad else version_check(lib, deps)
        if not versions["ok"]:  # importable, but of versions outside the agent's ranges
            bad = {"versions": "; ".join(versions["problems"])}
        return bad, versions["fixes"]

    bad, fixes = check()
    pip_error = ""
    if bad and "python" not in bad and not shipped:
        wanted = {reqs[m] for m in bad if m in reqs} | set(fixes)
        if "nni_agent.v1.agent_pb2_grpc" in bad:  # e.g. a too old protobuf: bring the pinned pair
            wanted |= {reqs["grpc"], reqs["google.protobuf"]}
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
               "--retries", "0", "--timeout", "10", "--target", deps, *sorted(wanted)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode == 0:
            bad, fixes = check()
        else:
            pip_error = (out.stderr.strip().splitlines() or ["pip failed"])[-1][:300]
    if not bad:
        with open(os.path.join(target, "pythons"), "a") as f:
            f.write(sys.executable + "\n")
    print(json.dumps({"ok": not bad, "missing": bad, "pip_error": pip_error, "deps_dir": deps,
                      "python": list(sys.version_info[:2]), "machine": platform.machine(), "libc": glibc()}))


main()
