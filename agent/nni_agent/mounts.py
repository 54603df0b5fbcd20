"""NNI's shared storage on the worker: mount NFS or an Azure blob container where trials expect it.

NNI mounts the experiment's `sharedStorage` on every training machine before a trial runs
(`sudo mount server:export <remoteMountPoint>`, or blobfuse for AzureBlob); the trial then works
in `<remoteMountPoint>/nni/<experiment>/trials/<trial>` and writes its outputs to `nnioutput`
there. The manager passes the storage in StartTrial's environment under `ENV_KEY` (over the
agent's authenticated stream: the account key is never in argv, a file or a log); the agent takes
it out before the trial's environment is built.

Commands run without a shell (argv lists), so no config value is ever interpreted by one; the
text of a command shown in an error is quoted (`shlex`). The account key reaches blobfuse2
through its environment (`AZURE_STORAGE_ACCESS_KEY`), never its command line.

Also runnable as `python -m nni_agent.mounts mount|unmount MOUNT_POINT` with the storage as JSON
on stdin: the manager's `localMounted: nnimount` uses the same code.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import sys
import threading
from pathlib import Path
from typing import Dict, List, Optional, Tuple

# shutil (which loads bz2 and lzma), shlex and subprocess are imported where used: an agent
# without shared storage never loads them (its idle memory is measured, docs/benchmarks.md)

log = logging.getLogger(__name__)

ENV_KEY = "NNI_AGENT_SHARED_STORAGE"  # StartTrial.env key holding the storage (JSON); never given to trials
MOUNT_TIMEOUT_S = 120.0  # an unreachable NFS server makes mount retry for minutes
STORAGE_TYPES = ("NFS", "AzureBlob")
CACHE_PREFIX = "nni-blobfuse-"  # the name of every blobfuse cache directory this module makes

_lock = threading.Lock()
_mounted: Dict[str, "Storage"] = {}  # mount point -> storage this process mounted (unmounted at exit)


class MountError(Exception):
    """The storage cannot be mounted: one line naming the cause (a missing tool, a permission,
    the mount's own message) and what to do."""


class Storage:
    """The `sharedStorage` section as the worker needs it."""

    def __init__(self, data: Dict[str, object]) -> None:
        self.storage_type = str(data.get("storageType", ""))
        if self.storage_type not in STORAGE_TYPES:
            raise MountError(f"shared storage: unknown storageType {self.storage_type!r} (NFS or AzureBlob)")
        self.mount_point = str(data.get("remoteMountPoint", ""))
        self.nfs_server = str(data.get("nfsServer") or "")
        self.exported_directory = str(data.get("exportedDirectory") or "")
        self.account = str(data.get("storageAccountName") or "")
        self.key = str(data.get("storageAccountKey") or "")
        self.container = str(data.get("containerName") or "")
        self.endpoint = str(data.get("blobEndpoint") or "")
        self._cache = None  # type: Optional[Path]

    def __repr__(self) -> str:  # never the key
        return f"Storage({self.storage_type}, {self.source()} at {self.mount_point})"

    @classmethod
    def from_json(cls, text: str) -> "Storage":
        try:
            data = json.loads(text)
        except ValueError:
            raise MountError("shared storage: the manager sent an unreadable storage description") from None
        if not isinstance(data, dict):
            raise MountError("shared storage: the manager sent an unreadable storage description")
        return cls(data)

    def source(self) -> str:
        """What is mounted, as users name it (no secret)."""
        if self.storage_type == "NFS":
            return f"{self.nfs_server}:{self.exported_directory}"
        return f"container {self.container} of account {self.account}"

    def root(self, work_root: Path) -> Path:
        """Where this worker sees the storage: remoteMountPoint, a relative one under the agent's
        work directory (NNI: relative to the environment's working directory)."""
        path = Path(self.mount_point).expanduser()
        return path if path.is_absolute() else work_root / path

    def mount_argv(self, mount_point: Path) -> Tuple[List[str], Dict[str, str]]:
        """(argv, extra environment) that mounts the storage at `mount_point`, without privileges."""
        if self.storage_type == "NFS":
            return ["mount", "-t", "nfs", self.source(), str(mount_point)], {}
        # blobfuse2 reads these (component/azstorage/config.go; its own TestEnvVarMount mounts this way);
        # blobfuse (v1) reads the account and key from the same variables
        env = {"AZURE_STORAGE_ACCOUNT": self.account, "AZURE_STORAGE_ACCESS_KEY": self.key,
               "AZURE_STORAGE_ACCOUNT_CONTAINER": self.container}
        if self.endpoint:
            env["AZURE_STORAGE_BLOB_ENDPOINT"] = self.endpoint
        tool = self.tool()
        if tool == "blobfuse":
            return [tool, str(mount_point), f"--tmp-path={self.tmp_path()}", f"--container-name={self.container}",
                    "-o", "allow_other"], env
        return [tool, "mount", str(mount_point), f"--tmp-path={self.tmp_path()}", "-o", "allow_other"], env

    def tmp_path(self) -> Path:
        """blobfuse's local cache of this container (NNI: /mnt/resource/nniblobfusetmp), made on first
        use: a fresh private directory (mkdtemp in $TMPDIR: 0700, this user's, a name nobody can
        guess). A predictable /tmp path could be made first by another user, who then reads the
        container's blobs from the cache (OSError when it cannot be made)."""
        if self._cache is None:
            import tempfile

            label = re.sub(r"[^A-Za-z0-9-]", "", f"{self.account}-{self.container}")[:64]
            self._cache = Path(tempfile.mkdtemp(prefix=f"{CACHE_PREFIX}{label}-"))
        return self._cache

    def discard_cache(self) -> None:
        """Remove blobfuse's cache (its copies of the container's blobs) once nothing is mounted from
        it: a failed mount, or the agent's own unmount at exit. Each mount makes a fresh one."""
        if self._cache is not None:
            import shutil

            shutil.rmtree(self._cache, ignore_errors=True)
            self._cache = None

    def tool(self) -> str:
        """The mount helper this storage needs (NNI: nfs-common's mount.nfs, blobfuse)."""
        import shutil

        if self.storage_type == "NFS":
            return "mount.nfs"
        return "blobfuse2" if shutil.which("blobfuse2") or not shutil.which("blobfuse") else "blobfuse"


def trial_directory(root: Path, experiment_id: str, trial_id: str) -> Path:
    """NNI's layout on shared storage: <mount>/nni/<experiment>/trials/<trial> (cwd + NNI_SYS_DIR),
    with NNI_OUTPUT_DIR its `nnioutput` folder."""
    return root / "nni" / experiment_id / "trials" / trial_id


def shown(argv: List[str]) -> str:
    """A command line as a shell would need it: every value quoted."""
    import shlex

    return " ".join(shlex.quote(a) for a in argv)


def is_mounted(path: Path) -> bool:
    """Whether something is mounted at `path`: a bind mount of a directory on the same file system
    too, which os.path.ismount cannot tell (the kernel's mount table says)."""
    if os.path.ismount(path):
        return True
    try:
        wanted = os.path.realpath(path)
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split(" ")
                if len(fields) > 4 and _unescape(fields[4]) == wanted:
                    return True
    except OSError:
        pass
    return False


def _unescape(field: str) -> str:  # mountinfo writes space, tab, newline and backslash as \ooo
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def ensure_mounted(storage: Storage, mount_point: Path) -> bool:
    """Mount `storage` at `mount_point` unless something is mounted there already (the user's own
    mount, or an earlier trial's); True when this call mounted it. Raises MountError."""
    with _lock:
        if is_mounted(mount_point):
            return False
        what = f"{storage.storage_type} shared storage: cannot mount {storage.source()} on {mount_point}"
        _check_tools(storage, what)
        if storage.storage_type == "AzureBlob":
            try:
                storage.tmp_path()
            except OSError as e:
                raise MountError(f"{what}: cannot create blobfuse's cache in {os.environ.get('TMPDIR') or '/tmp'}: "
                                 f"{e.strerror or e} (set TMPDIR to a writable directory)") from None
        try:
            prefix = _privilege_prefix(what, storage)
            try:
                mount_point.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise MountError(f"{what}: cannot create the mount point: {e.strerror or e}") from None
            argv, extra = storage.mount_argv(mount_point)
            said = _run(prefix + argv, extra, what, storage)
            if not is_mounted(mount_point):  # mount.nfs exited 0 after "No such device" under an SSH-started agent
                raise MountError(f"{what}: `{shown(prefix + argv)}` exited 0 but left nothing mounted there"
                                 + (f": {said}{_hint(said, storage)}" if said else ""))
        except MountError:
            storage.discard_cache()
            raise
        _mounted[str(mount_point)] = storage
        log.info("mounted %s on %s", storage.source(), mount_point)
        return True


def unmount(mount_point: Path) -> bool:
    """Unmount (lazily, as NNI's `umount -l`) a mount point; errors are logged, not raised. True
    when nothing is mounted there now."""
    import shutil
    import subprocess

    if not is_mounted(mount_point):
        return True
    argv = ["umount", "-l", str(mount_point)]
    if os.geteuid() != 0 and shutil.which("sudo"):
        argv = ["sudo", "-n"] + argv
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        log.warning("cannot unmount %s: %s", mount_point, _last_line(result.stderr) or f"exit {result.returncode}")
        return False
    return True


def blobfuse_cache_of(mount_point: Path) -> Optional[Path]:
    """The cache (`--tmp-path`) of the blobfuse process serving `mount_point`, read from its command
    line: the helper's `unmount` runs in another process than its `mount`, which kept no record (the
    storage's key must not be written anywhere). None where no such process is found."""
    target = str(mount_point)
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = [a.decode("utf-8", "surrogateescape") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        # the tool itself (argv[0]), or the script an interpreter runs (argv[1]); never sudo's line
        if target in args and any(os.path.basename(a) in ("blobfuse", "blobfuse2") for a in args[:2]):
            for a in args:
                if a.startswith("--tmp-path="):
                    return Path(a[len("--tmp-path="):])
    return None


def remove_cache(path: Path) -> bool:
    """Remove a blobfuse cache this module made (Storage.tmp_path): named nni-blobfuse-*, a directory
    and not a link, this user's, 0700. Anything else is left alone: the path came from another
    process's command line. True when it was removed."""
    import shutil
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return False
    if (not path.name.startswith(CACHE_PREFIX) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid()
            or stat.S_IMODE(st.st_mode) != 0o700):
        log.warning("not removing %s: not a blobfuse cache this user's agent made", path)
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


@atexit.register
def _unmount_ours() -> None:
    """NNI unmounts the storage when the experiment ends: so does the agent that mounted it."""
    for mount_point in list(_mounted):
        try:
            if unmount(Path(mount_point)):  # detached: the trials are gone and closed their files (blobfuse
                _mounted[mount_point].discard_cache()  # uploads a file when it is closed)
        except Exception:  # at exit: never raise
            pass
        _mounted.pop(mount_point, None)


def _check_tools(storage: Storage, what: str) -> None:
    import shutil

    if storage.storage_type == "NFS":
        if not shutil.which("mount"):
            raise MountError(f"{what}: `mount` not found; install util-linux (mount) on this worker")
        if not (shutil.which("mount.nfs") or os.path.exists("/sbin/mount.nfs") or os.path.exists("/usr/sbin/mount.nfs")):
            raise MountError(f"{what}: mount.nfs not found; install nfs-common (Debian/Ubuntu) "
                             "or nfs-utils (RHEL/Fedora) on this worker")
        return
    if not (shutil.which("blobfuse2") or shutil.which("blobfuse")):
        raise MountError(f"{what}: blobfuse2 not found; install blobfuse2 (Microsoft's package repository: "
                         "https://github.com/Azure/azure-storage-fuse) on this worker")
    if not os.path.exists("/dev/fuse"):
        raise MountError(f"{what}: /dev/fuse is missing; FUSE is not available on this worker "
                         "(a container needs --device /dev/fuse --cap-add SYS_ADMIN)")


def _privilege_prefix(what: str, storage: Storage) -> List[str]:
    """[] as root; `sudo -n` otherwise (NNI requires passwordless sudo on training machines)."""
    import shutil

    if os.geteuid() == 0:
        return []
    if not shutil.which("sudo"):
        raise MountError(f"{what}: mounting needs root and sudo is not installed; run the agent as root "
                         "or install sudo with a passwordless rule for mount")
    if storage.storage_type == "AzureBlob":
        return ["sudo", "-n", "--preserve-env=" + ",".join(sorted(storage.mount_argv(Path("/"))[1]))]
    return ["sudo", "-n"]


def _run(argv: List[str], extra: Dict[str, str], what: str, storage: Storage) -> str:
    """Run a mount command; its last line of output when it succeeds, MountError when not."""
    import subprocess

    env = dict(os.environ)
    env.update(extra)
    try:
        result = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=MOUNT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise MountError(f"{what}: `{shown(argv)}` did not finish in {MOUNT_TIMEOUT_S:g}s; "
                         "is the server reachable from this worker?") from None
    except OSError as e:
        raise MountError(f"{what}: cannot run {argv[0]}: {e.strerror or e}") from None
    if result.returncode == 0:
        said = _last_line(result.stderr) or _last_line(result.stdout)
        return said.replace(storage.key, "***") if storage.key else said
    message = _last_line(result.stderr) or _last_line(result.stdout) or f"exit status {result.returncode}"
    if storage.key:
        message = message.replace(storage.key, "***")
    raise MountError(f"{what}: `{shown(argv)}` failed: {message}{_hint(message, storage)}")


def _hint(message: str, storage: Storage) -> str:
    low = message.lower()
    if "password is required" in low or "sudo:" in low and "not allowed" in low:
        return "; allow the agent's user passwordless sudo for mount (NNI requires it too) or run the agent as root"
    if storage.storage_type == "NFS" and ("unknown filesystem type" in low or "no such device" in low):
        return "; this machine's kernel has no NFS client (nfs is missing from /proc/filesystems)"
    if "permission denied" in low or "operation not permitted" in low:
        return "; mounting needs root (CAP_SYS_ADMIN): run the agent as root or with passwordless sudo"
    return ""


def _last_line(text: Optional[str]) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def main(argv: Optional[List[str]] = None) -> int:
    """`python -m nni_agent.mounts mount|unmount MOUNT_POINT`, the storage (JSON) on stdin."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("mount", "unmount"):
        print("usage: python -m nni_agent.mounts mount|unmount MOUNT_POINT  (storage JSON on stdin)", file=sys.stderr)
        return 2
    mount_point = Path(args[1])
    if args[0] == "unmount":
        cache = blobfuse_cache_of(mount_point)  # read while blobfuse still serves the mount
        if unmount(mount_point) and cache is not None:
            remove_cache(cache)  # its copies of the container's blobs go with the mount
        return 0
    try:
        mounted = ensure_mounted(Storage.from_json(sys.stdin.read()), mount_point)
    except MountError as e:
        print(str(e), file=sys.stderr)
        return 1
    print("mounted" if mounted else "already mounted")
    _mounted.clear()  # the caller keeps it mounted and unmounts it when the experiment ends
    return 0


if __name__ == "__main__":
    sys.exit(main())
