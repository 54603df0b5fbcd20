"""The agent's one boot step on every platform: `python boot.py [options] -- <agent arguments>`.

Any Python 3 can parse this file and run its first lines (stdlib only, no f-strings, no
annotations), so a worker whose Python is too old gets one line saying so, not a SyntaxError.
It checks the Python version and the *versions* of the agent's dependencies (REQUIREMENTS,
which tests/test_boot.py holds against pyproject.toml), puts the agent and any shipped
dependencies on the agent's own path, and execs the agent. Every failure is
one line on stderr starting "nni-agent: " (and in --message-file, e.g. a pod's termination log):
the backends make it the trial's or the environment's message. Exit status 3 on failure.

The manager builds this command line (its backends/agent_command.py); the script travels
as a file (the agent wheel, a ConfigMap) or inline (`python -c`), so it holds no template tag
(OpenPAI renders its `<` `%` tags in commands) and reads nothing but its arguments.

Shipped code is trusted by its digest, never by its name or place: the command line (which
whoever can write the shared place cannot edit) carries `--sha256 NAME=HEX` for the agent wheel
and every dependency wheel. Each is copied out of the shared place while hashed, refused in one
line if it differs or is missing, and unpacked into a private directory (0700, this user's);
such a directory is reused only when it is this user's, 0700, and holds the stamp of the same
digests. Pieces no digest names are ignored.

The agent's path reaches the agent only: it runs as `python -c BOOTSTRAP nni_agent <paths> --
<args>`, which puts the paths on its sys.path, so PYTHONPATH (and with it every trial's
environment) stays the worker's own. A trial that imports protobuf gets its image's, never the agent's.
"""
import os
import stat
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
STAMP = ".nni-agent-digests"  # in a private directory this boot step unpacked: the digests it holds
# in a private directory unpacked for one start only (no reusable place was safe): the agent removes it at exit
THROWAWAY = ".nni-agent-throwaway"
# `python -c BOOTSTRAP nni_agent <path>... -- <agent arguments>`: the agent's paths on its own
# sys.path only (nni_agent.trial_path.BOOT_PATHS tells the agent which they were), never in
# PYTHONPATH; the module's name stays a word of its argv, as with `-m nni_agent`
BOOTSTRAP = ("import runpy, sys\n"
             "n = sys.argv.index('--')\n"
             "module, paths = sys.argv[1], sys.argv[2:n]\n"
             "sys.path[:0] = paths\n"
             "sys.argv[:] = [sys.argv[0]] + sys.argv[n + 1:]\n"
             "try:\n"
             "    import nni_agent.trial_path\n"
             "    nni_agent.trial_path.BOOT_PATHS[:] = paths\n"
             "except ImportError:\n"
             "    pass\n"
             "try:\n"
             "    runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
             "finally:\n"  # a fresh copy made for this one start goes with it
             "    import os, shutil\n"
             "    for p in paths:\n"
             "        if os.path.isfile(os.path.join(p, %r)):\n"
             "            shutil.rmtree(p, ignore_errors=True)\n" % THROWAWAY)


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
        self.digests = {}  # "name" or "cp311/name" -> sha256 of a shipped file (--sha256 NAME=HEX)
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
            elif a == "--sha256":
                name, _, digest = value.partition("=")
                if not name or len(digest) != 64:
                    self.fail("boot option --sha256 needs NAME=<64 hex digits>, not %s" % value)
                self.digests[name] = digest.lower()
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
        args = getattr(self, "agent_args", [])
        if "--remove-at-exit" in args[:-1]:  # the agent will not run to remove its job's private directory
            remove_private(args[args.index("--remove-at-exit") + 1])
        sys.exit(FAILED)


def python_words(boot):
    """`Python 3.7.9 (/usr/bin/python3) of the image python:3.7`."""
    words = "Python %s (%s)" % (".".join(str(n) for n in sys.version_info[:3]), sys.executable)
    return words + (" of " + boot.where if boot.where else "")


def check_python(boot):
    if tuple(sys.version_info[:2]) < MIN_PYTHON:
        boot.fail("%s is older than %d.%d, the oldest the agent runs on: use a Python >= %d.%d "
                  "(pythonPath, or an image that has one)" % ((python_words(boot),) + MIN_PYTHON + MIN_PYTHON))


def own_python_key():
    return "cp%d%d" % tuple(sys.version_info[:2])


def expected(boot):
    """{wheel file name: sha256} this Python needs: names without a prefix, and `cp311/<name>`
    entries for this Python only (the per-CPython layout of OpenPAI and AML)."""
    mine = own_python_key() + "/"
    out = {}
    for name, digest in boot.digests.items():
        if "/" not in name:
            out[name] = digest
        elif name.startswith(mine):
            out[name[len(mine):]] = digest
    return out


def private(path):
    """This user's directory of mode 0700 (not a link): nobody else can have written inside."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


JOB_DIR_PREFIX = "nni-agent."  # a job's private directory, as the boot line's `mktemp -d .../nni-agent.XXXXXX` names it


def removable(path):
    """`path` is what a boot line's `mktemp -d` made for one agent: named so, this user's, 0700."""
    return os.path.basename(os.path.normpath(path)).startswith(JOB_DIR_PREFIX) and private(path)


def remove_private(path):
    """Remove `path` if it is `removable`; anything else (a typo'd, shared or home directory) is
    left alone."""
    import shutil

    if removable(path):
        shutil.rmtree(path, ignore_errors=True)


def reusable(path, stamp):
    """A directory this boot step unpacked earlier, holding the same digests."""
    if not private(path):
        return False
    try:
        with open(os.path.join(path, STAMP)) as f:
            return f.read() == stamp
    except (IOError, OSError):
        return False


def safe_parent(path):
    """Nobody but this user (or root) can rename or replace entries in `path`'s directory."""
    try:
        st = os.stat(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    sticky = st.st_mode & stat.S_ISVTX
    return st.st_uid in (0, os.getuid()) and (sticky or not st.st_mode & 0o022)


def stamp_of(digests):
    return "".join("%s=%s\n" % kv for kv in sorted(digests.items()))


def verified_copy(boot, name, paths, digest, dest):
    """Join `paths` (a file, or its pieces in order) into `dest` while hashing; one line if the
    result is not the file the command line names."""
    import hashlib

    h = hashlib.sha256()
    try:
        with open(dest, "wb") as out:
            for p in paths:
                with open(p, "rb") as f:
                    while True:
                        block = f.read(1 << 20)
                        if not block:
                            break
                        h.update(block)
                        out.write(block)
    except (IOError, OSError) as e:
        boot.fail("cannot read the shipped file %s: %s" % (name, e))
    if h.hexdigest() != digest:
        boot.fail("the shipped file %s (%s) is not the one the manager shipped (sha256 %s, expected %s): "
                  "someone else changed it; nothing of it was run. Fix: keep others from writing there and restart the "
                  "experiment (the manager ships it again)"
                  % (name, paths[0] if len(paths) == 1 else os.path.dirname(paths[0]), h.hexdigest()[:16],
                     digest[:16]))


def temp_home(stamp):
    """Where a shipment unpacks when the place the command line names is not safe (a shared,
    world-writable directory): this user's temp dir, under a name fixed by the digests, so every
    start of the same shipment reuses one copy instead of leaving one behind each."""
    import hashlib
    import tempfile

    key = hashlib.sha256(stamp.encode()).hexdigest()[:20]
    return os.path.join(tempfile.gettempdir(), ".nni-agent-%d-%s" % (os.getuid(), key))


def unpack_private(boot, target, wheels, what):
    """Unpack {name: (paths, digest)} into `target` after verifying each, or reuse `target` if this
    boot step made it with the same digests. Returns the directory the agent uses: `target`; where
    `target`'s directory is not safe, the shipment's temp_home; or, where that too is someone else's
    (a planted directory is never read), a fresh private one marked THROWAWAY, which the agent
    removes when it exits."""
    import shutil
    import tempfile
    import zipfile

    stamp = stamp_of(dict((n, d) for n, (_, d) in wheels.items()))
    if reusable(target, stamp):
        return target
    named = target
    if not safe_parent(target):  # the shared place's directory is not safe to rename into
        target = temp_home(stamp)
        if reusable(target, stamp):
            return target
    beside = safe_parent(target)
    try:
        tmp = tempfile.mkdtemp(prefix=".nni-agent-", dir=os.path.dirname(os.path.abspath(target)) if beside
                               else None)  # mkdtemp: this user's, 0700
    except OSError as e:
        boot.fail("cannot unpack %s into %s: %s" % (what, named, e))
    try:
        for name, (paths, digest) in sorted(wheels.items()):
            whl = os.path.join(tmp, ".whl")
            verified_copy(boot, name, paths, digest, whl)  # verified before anything is unpacked
            try:
                zipfile.ZipFile(whl).extractall(tmp)
                os.remove(whl)
            except (OSError, zipfile.BadZipFile) as e:
                boot.fail("cannot unpack %s (%s) into %s: %s" % (what, name, named, e))
    except SystemExit:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    with open(os.path.join(tmp, STAMP), "w") as f:
        f.write(stamp)
    if beside:
        if private(target) and not reusable(target, stamp):  # our own, from another shipment or an older boot step
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            pass  # another boot's won (then it is reusable), or someone else's is there
        if reusable(target, stamp):
            shutil.rmtree(tmp, ignore_errors=True)
            return target
    with open(os.path.join(tmp, THROWAWAY), "w") as f:
        f.write("")  # this start's own copy: nothing else will reuse it
    return tmp


def unpack(boot):
    """The agent wheel, verified and unpacked into --unpack-to (or a fresh private directory)."""
    name = os.path.basename(boot.wheel)
    digest = expected(boot).get(name)
    if digest is None:
        boot.fail("no --sha256 for the agent wheel %s (the manager and this boot script disagree)" % name)
    if not os.path.isfile(boot.wheel):
        boot.fail("the shipped file %s is missing (%s)" % (name, boot.wheel))
    return unpack_private(boot, boot.unpack_to, {name: ([boot.wheel], digest)}, "the agent wheel")


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
    """The shipped dependency wheels the command line names (for this Python), each joined from its
    pieces, verified and unpacked into --deps-to (or a fresh private directory); pieces of any other
    name are ignored. None when nothing was shipped for this Python."""
    wanted = dict((n, d) for n, d in expected(boot).items() if boot.wheel is None
                  or n != os.path.basename(boot.wheel))
    if not wanted:
        return None
    found = pieces(boot.parts)
    missing = sorted(n for n in wanted if n not in found)
    if missing:
        boot.fail("the shipped file %s is missing from %s" % (missing[0], " ".join(boot.parts)))
    return unpack_private(boot, boot.deps_to, dict((n, (found[n], d)) for n, d in wanted.items()),
                          "the shipped dependencies")


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
        boot.paths.insert(0, unpack(boot))
    if boot.parts and boot.deps_to:
        deps = assemble(boot)
        if deps:
            boot.paths.append(deps)
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
    args = boot.agent_args
    if boot.agent_id_env:
        agent_id = os.environ.get(boot.agent_id_env)
        if not agent_id:
            boot.fail("the environment variable %s (the agent's id) is not set" % boot.agent_id_env)
        args = [a.replace("{agent}", agent_id) for a in args]
    sys.stdout.flush()
    sys.stderr.flush()
    if paths:  # on the agent's own path, never in PYTHONPATH: the trials inherit the worker's
        os.execv(sys.executable, [sys.executable, "-c", BOOTSTRAP, "nni_agent"] + paths + ["--"] + args)
    os.execv(sys.executable, [sys.executable, "-m", "nni_agent"] + args)
    return FAILED


if __name__ == "__main__":
    here = os.path.dirname(os.path.realpath(globals().get("__file__") or "-"))
    if sys.path and sys.path[0] and os.path.realpath(sys.path[0]) == here:
        del sys.path[0]  # run as a file inside nni_agent/: its modules must not shadow the stdlib's
    sys.exit(main(sys.argv[1:]))
