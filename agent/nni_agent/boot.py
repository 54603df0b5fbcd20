"""The agent's one boot step on every platform: `python boot.py [options] -- <agent arguments>`.

Any Python 3 can parse this file and run its first lines (stdlib only, no f-strings, no
annotations), so a worker whose Python is too old gets one line saying so, not a SyntaxError.
It checks the Python version and the *versions* of the agent's dependencies (REQUIREMENTS,
which tests/test_boot.py holds against pyproject.toml), puts the agent and any shipped
dependencies on the path, and execs `python -m nni_agent <agent arguments>`. Every failure is
one line on stderr starting "nni-agent: " (and in --message-file, e.g. a pod's termination log):
the backends make it the trial's or the environment's message. Exit status 3 on failure.

The manager builds this command line (its backends/agent_command.py); the script travels
as a file (the agent wheel, a ConfigMap) or inline (`python -c`), so it holds no template tag
(OpenPAI renders its `<` `%` tags in commands) and reads nothing but its arguments.
"""
import os
import sys

MIN_PYTHON = (3, 8)  # the oldest Python the agent runs on
# The agent's dependencies: (distribution, module, lowest version, first version not supported or
# None, required). Optional ones are checked only when present (nvidia-ml-py: GPUs are reported
# as absent without it).
REQUIREMENTS = (
    ("grpcio", "grpc", "1.49.1", "2", True),
    ("protobuf", "google.protobuf", "4.25.1", "8", True),
    ("psutil", "psutil", "5.9.4", "8", True),
    ("nvidia-ml-py", "pynvml", "12.535", None, False),
)
FAILED = 3  # exit status of a failed boot


def requirement(dist, low, below):
    """`grpcio>=1.49.1,<2`, as pip takes it."""
    return "%s>=%s%s" % (dist, low, ",<" + below if below else "")


def version_tuple(text):
    """`1.49.1rc2` -> (1, 49, 1): release numbers only (enough for lower and upper bounds)."""
    out = []
    for part in text.split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if len(digits) < len(part):
            break
    return tuple(out)


class Boot:
    """The parsed command line: boot options, then the agent's own arguments after `--`."""

    def __init__(self, argv):
        self.paths = []  # put first on sys.path / PYTHONPATH (dirs or wheels; missing ones skipped)
        self.wheel = None  # unpack this wheel ...
        self.unpack_to = None  # ... into this directory (once; then it goes on the path)
        self.where = ""  # whose Python, in the message ("the image python:3.8", "the compute node")
        self.message_file = None  # also write the failure line here (/dev/termination-log)
        self.agent_id_env = None  # replace "{agent}" in the agent's arguments with this variable
        self.check_only = False  # check only: one JSON line on stdout ({"ok", "problems", "fixes"}), no agent
        self.report = None  # --check: also write that JSON line here (a probe pod's termination log)
        self.parts = []  # dirs of wheel pieces `<wheel>.<nnn>` (ConfigMap keys: each object < 1 MiB) ...
        self.deps_to = None  # ... joined and unpacked once into this directory, which goes on the path
        self.agent_args = []
        i = 0
        while i < len(argv):
            a = argv[i]
            if a == "--":
                self.agent_args = list(argv[i + 1:])
                break
            if a == "--check":
                self.check_only = True
                i += 1
                continue
            if i + 1 >= len(argv):
                self.fail("boot option %s needs a value" % a)
            value = argv[i + 1]
            if a == "--path":
                self.paths.append(value)
            elif a == "--wheel":
                self.wheel = value
            elif a == "--unpack-to":
                self.unpack_to = value
            elif a == "--where":
                self.where = value
            elif a == "--message-file":
                self.message_file = value
            elif a == "--agent-id-env":
                self.agent_id_env = value
            elif a == "--report":
                self.report = value
            elif a == "--parts":
                self.parts.append(value)
            elif a == "--deps-to":
                self.deps_to = value
            else:
                self.fail("unknown boot option %s (the manager and this boot script disagree)" % a)
            i += 2

    def fail(self, message):
        """One line on stderr (and in --message-file), exit status 3."""
        line = "nni-agent: " + " ".join(message.split())
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        message_file = getattr(self, "message_file", None)
        if message_file:
            try:
                with open(message_file, "w") as f:
                    f.write(line)
            except (IOError, OSError):
                pass
        sys.exit(FAILED)


def python_words(boot):
    """`Python 3.7.9 (/usr/bin/python3) of the image python:3.7`."""
    words = "Python %s (%s)" % (".".join(str(n) for n in sys.version_info[:3]), sys.executable)
    return words + (" of " + boot.where if boot.where else "")


def check_python(boot):
    if tuple(sys.version_info[:2]) < MIN_PYTHON:
        boot.fail("%s is older than %d.%d, the oldest the agent runs on: use a Python >= %d.%d "
                  "(pythonPath, or an image that has one)" % ((python_words(boot),) + MIN_PYTHON + MIN_PYTHON))


def unpack(boot):
    """The agent wheel, unpacked once into --unpack-to (beside, then renamed: concurrent boots are safe)."""
    import shutil
    import tempfile
    import zipfile

    if os.path.isdir(boot.unpack_to):
        return
    parent = os.path.dirname(boot.unpack_to.rstrip("/")) or "."
    try:
        tmp = tempfile.mkdtemp(prefix=".agent-", dir=parent)
        zipfile.ZipFile(boot.wheel).extractall(tmp)
        try:
            os.rename(tmp, boot.unpack_to)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not os.path.isdir(boot.unpack_to):
                raise
    except (OSError, zipfile.BadZipFile) as e:
        boot.fail("cannot unpack the agent wheel %s into %s: %s" % (boot.wheel, boot.unpack_to, e))


def pieces(dirs):
    """{wheel file name: [piece paths in order]} under `dirs` (one level of subdirectories; a
    ConfigMap volume's `..data` bookkeeping skipped)."""
    found = {}  # type: dict
    todo = list(dirs)
    while todo:
        d = todo.pop(0)
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for n in names:
            p = os.path.join(d, n)
            if n.startswith(".."):
                continue
            if os.path.isdir(p):
                if d in dirs:
                    todo.append(p)
                continue
            stem, _, num = n.rpartition(".")
            if stem.endswith(".whl") and num.isdigit():
                found.setdefault(stem, []).append((int(num), p))
    return dict((k, [p for _, p in sorted(v)]) for k, v in found.items())


def assemble(boot):
    """Shipped dependency wheels, joined from their pieces and unpacked once into --deps-to (beside,
    then renamed: concurrent boots are safe). A wheel installs by unpacking."""
    import shutil
    import tempfile
    import zipfile

    if os.path.isdir(boot.deps_to):
        return
    wheels = pieces(boot.parts)
    if not wheels:
        return
    parent = os.path.dirname(boot.deps_to.rstrip("/")) or "."
    try:
        tmp = tempfile.mkdtemp(prefix=".deps-", dir=parent)
        for name, paths in sorted(wheels.items()):
            whl = os.path.join(tmp, name)
            with open(whl, "wb") as out:
                for p in paths:
                    with open(p, "rb") as f:
                        shutil.copyfileobj(f, out)
            zipfile.ZipFile(whl).extractall(tmp)
            os.remove(whl)
        try:
            os.rename(tmp, boot.deps_to)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not os.path.isdir(boot.deps_to):
                raise
    except (OSError, zipfile.BadZipFile) as e:
        boot.fail("cannot unpack the shipped dependencies into %s: %s" % (boot.deps_to, e))


def worker():
    """What decides which wheels fit this Python: version, machine, C library."""
    import platform

    lib, ver = platform.libc_ver()
    return {"version": "%d.%d" % tuple(sys.version_info[:2]), "machine": platform.machine(),
            "libc": ("%s %s" % (lib, ver)).strip()}


def problems():
    """What keeps the agent from running with this Python and path: one phrase each, and the
    requirements that fix them."""
    import importlib.util
    from importlib import metadata

    out, fixes = [], []
    for dist, module, low, below, required in REQUIREMENTS:
        wanted = requirement(dist, low, below)
        try:
            found = importlib.util.find_spec(module) is not None  # google.protobuf: imports google only
        except (ImportError, ValueError):
            found = False
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = None
        if not found:
            if required:
                out.append("%s is missing" % dist)
                fixes.append(wanted)
            continue
        if version is None:
            continue  # importable without metadata (a vendor's build): nothing to judge
        v = version_tuple(version)
        if v < version_tuple(low):
            out.append("%s %s is older than %s" % (dist, version, low))
            fixes.append(wanted)
        elif below and v >= version_tuple(below):
            out.append("%s %s is newer than the agent supports (below %s)" % (dist, version, below))
            fixes.append(wanted)
    try:
        agent = importlib.util.find_spec("nni_agent") is not None
    except (ImportError, ValueError):
        agent = False
    if not agent:
        out.append("the nni-agent package is missing (pip install nni-agent)")
    return out, fixes


def fail_with(boot, out, fixes):
    fix = ""
    if fixes:
        fix = "; fix: %s -m pip install %s" % (sys.executable, " ".join("'%s'" % f for f in fixes))
    boot.fail("%s cannot run the agent: %s%s" % (python_words(boot), "; ".join(out), fix))


def main(argv):
    boot = Boot(argv)
    check_python(boot)
    if boot.wheel and boot.unpack_to:
        unpack(boot)
        boot.paths.insert(0, boot.unpack_to)
    if boot.parts and boot.deps_to:
        assemble(boot)
        boot.paths.append(boot.deps_to)
    paths = [p for p in boot.paths if os.path.exists(p)]
    sys.path[:0] = paths
    out, fixes = problems()
    if boot.check_only:  # for an installer that can add what is missing (the remote backend's)
        import json

        report = dict(worker(), ok=not out, python=sys.executable, problems=out, fixes=fixes)
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()
        if boot.report:
            try:
                with open(boot.report, "w") as f:
                    f.write(json.dumps(report))
            except (IOError, OSError):
                pass
    if out:
        fail_with(boot, out, fixes)
    if boot.check_only:
        return 0
    if paths:
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([old] if old else []))
    args = boot.agent_args
    if boot.agent_id_env:
        agent_id = os.environ.get(boot.agent_id_env)
        if not agent_id:
            boot.fail("the environment variable %s (the agent's id) is not set" % boot.agent_id_env)
        args = [a.replace("{agent}", agent_id) for a in args]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "nni_agent"] + args)
    return FAILED


if __name__ == "__main__":
    here = os.path.dirname(os.path.realpath(globals().get("__file__") or "-"))
    if sys.path and sys.path[0] and os.path.realpath(sys.path[0]) == here:
        del sys.path[0]  # run as a file inside nni_agent/: its modules must not shadow the stdlib's
    sys.exit(main(sys.argv[1:]))
