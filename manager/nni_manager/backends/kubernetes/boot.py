"""The container command that starts the agent inside any image with Python >= 3.8.

The manager's own agent wheel arrives as a ConfigMap volume (it is pure Python and small),
the token and CA as a Secret volume; the command unpacks the wheel into the pod's scratch
volume, checks that the image has the agent's dependencies, and execs the agent. Every
problem ends the container with one line in its termination message, which becomes the
trial's `message`. Nothing secret is on the command line.
"""
from __future__ import annotations

from nni_agent.compat import MIN_PYTHON, MIN_PYTHON_TEXT

SECRET_DIR = "/var/run/nni/secret"  # ca.crt and one token file per agent (named for its pod)
WHEEL_DIR = "/var/run/nni/agent"  # the agent wheel (ConfigMap)
WORK_DIR = "/var/run/nni/work"  # emptyDir: unpacked agent, bundles, trial directories

BOOT_FILE = "boot.py"  # BOOT, beside the wheel in the agent ConfigMap
# Runs as `python boot.py <agent args>`, stdlib only, any Python 3.
BOOT = r'''
import os, sys, tempfile, zipfile
def fail(msg):
    sys.stderr.write("nni-agent: " + msg + "\n")
    try:
        with open("/dev/termination-log", "w") as f:
            f.write(msg)
    except OSError:
        pass
    sys.exit(3)
ver = "%d.%d.%d" % sys.version_info[:3]
if sys.version_info < MIN_PYTHON:
    fail("Python %s (%s) is too old: nni-agent needs Python >= MIN_PYTHON_TEXT in the image" % (ver, sys.executable))
wheel, tag, work = os.environ["NNI_AGENT_WHEEL"], os.environ["NNI_AGENT_TAG"], os.environ["NNI_AGENT_WORK"]
lib = os.path.join(work, "agent-" + tag)
if not os.path.isdir(lib):
    tmp = tempfile.mkdtemp(prefix=".agent-", dir=work)
    zipfile.ZipFile(wheel).extractall(tmp)
    os.rename(tmp, lib)
sys.path.insert(0, lib)
missing = []
for item in os.environ["NNI_AGENT_MODULES"].split(","):
    module, _, requirement = item.partition("=")
    try:
        __import__(module)
    except Exception as e:
        missing.append("%s (%s: %s)" % (requirement, type(e).__name__, e))
if missing:
    fail("the image lacks the agent's dependencies for Python %s: %s; add `pip install %s` to the image"
         % (ver, "; ".join(missing), " ".join(m.split(" ")[0] for m in missing)))
os.environ["PYTHONPATH"] = lib + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
agent_id = os.environ["NNI_AGENT_ID"]
os.execv(sys.executable, [sys.executable, "-m", "nni_agent"] + [a.replace("{agent}", agent_id) for a in sys.argv[1:]])
'''.strip().replace("MIN_PYTHON_TEXT", MIN_PYTHON_TEXT).replace("MIN_PYTHON", repr(MIN_PYTHON))

# "$@" are the agent's arguments.
SHELL = ('PY=$(command -v python3 || command -v python) || { echo "nni-agent: the image has no python3 or python '
         f'on PATH" | tee /dev/termination-log >&2; exit 127; }}; exec "$PY" {WHEEL_DIR}/{BOOT_FILE} "$@"')


def agent_args(hub_address: str, tls: bool, orphan_timeout: float, single_trial: bool) -> list[str]:
    # "{agent}" is the pod's name (NNI_AGENT_ID, from the downward API): the agent's id
    args = ["--manager", hub_address, "--agent-id", "{agent}", "--token-file", f"{SECRET_DIR}/{{agent}}",
            "--work-dir", WORK_DIR, "--orphan-timeout", f"{orphan_timeout:g}"]
    if tls:
        args += ["--ca-file", f"{SECRET_DIR}/ca.crt"]
    if single_trial:
        args.append("--single-trial")
    return args


def container_command(args: list[str], prefix: str = "") -> list[str]:
    """`sh -c` that finds Python and runs BOOT; `prefix` is shell run first (e.g. sourcing
    FrameworkController's barrier output)."""
    return ["sh", "-c", (prefix + " && " if prefix else "") + SHELL, "nni-agent-boot", *args]
