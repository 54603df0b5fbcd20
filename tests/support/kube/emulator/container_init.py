"""Runs inside each emulated container before exec: private mount+UTS namespace, volumes, exec.

Usage: python -I container_init.py SPEC.json   (spec written by the kubelet)
Stand-alone on purpose (no imports from the tests package).
"""
import ctypes
import json
import os
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWNET = 0x00020000, 0x04000000, 0x40000000
MS_RDONLY, MS_BIND, MS_REC, MS_PRIVATE = 1, 4096, 16384, 1 << 18
libc = ctypes.CDLL(None, use_errno=True)


def _check(rc, what):
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def mount(src, target, fstype, flags, data=None):
    _check(libc.mount(src.encode() if src else None, target.encode(), fstype.encode() if fstype else None,
                      ctypes.c_ulong(flags), data.encode() if data else None), f"mount {src} on {target}")


def _nearest_existing(path):
    anc = os.path.dirname(path.rstrip("/")) or "/"
    while not os.path.isdir(anc):
        anc = os.path.dirname(anc) or "/"
    return anc


def ensure_paths(targets, scratch):
    """Create the missing mount points (dirs, or empty files) without touching the host: overlay
    their nearest existing ancestors with tmpfs-backed upper layers, private to this mount
    namespace: one overlay per outermost ancestor, so no later overlay hides an earlier one."""
    missing = [(t, is_file) for t, is_file in targets if not os.path.lexists(t)]
    ancestors = {_nearest_existing(t) for t, _ in missing}
    outermost = [a for a in ancestors
                 if not any(b != a and (b == "/" or a.startswith(b.rstrip("/") + "/")) for b in ancestors)]
    for i, anc in enumerate(sorted(outermost)):
        up, work = os.path.join(scratch, f"up{i}"), os.path.join(scratch, f"work{i}")
        os.makedirs(up)
        os.makedirs(work)
        try:
            mount("overlay", anc, "overlay", 0, f"lowerdir={anc},upperdir={up},workdir={work}")
        except OSError:
            pass        # fall back: the kubelet pre-created the host path and removes it at the end
    for path, is_file in missing:
        os.makedirs(os.path.dirname(path) if is_file else path, exist_ok=True)
        if is_file and not os.path.exists(path):
            open(path, "a").close()


def main():
    spec = json.load(open(sys.argv[1]))
    if spec.get("netns"):  # the pod network (a namespace of the emulator's own), not the host's
        fd = os.open(spec["netns"], os.O_RDONLY)
        _check(libc.setns(fd, CLONE_NEWNET), "setns")
        os.close(fd)
    if spec.get("namespaces"):
        _check(libc.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare")
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        host = spec["hostname"].encode()[:63]
        _check(libc.sethostname(host, len(host)), "sethostname")
        scratch = spec["scratch"]
        # every source held open first: an overlay made below over one of its ancestors (a volume
        # under /tmp, a mount point /tmp/mount) would else turn it into the overlay's copy, and what
        # the pod writes to an NFS export or a claim would stay in the pod
        sources = [os.open(m["source"], O_PATH | os.O_CLOEXEC) for m in spec["mounts"]]
        mount("tmpfs", scratch, "tmpfs", 0, "mode=0700")
        # every mount point first: an overlay made after a bind mount below it would hide it
        ensure_paths([(m["target"], os.path.isfile(m["source"])) for m in spec["mounts"]], scratch)
        for m, fd in zip(spec["mounts"], sources):
            dst = m["target"]
            mount(f"/proc/self/fd/{fd}", dst, None, MS_BIND | MS_REC)
            os.close(fd)
            if m.get("readOnly"):
                mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
    wd = spec.get("workingDir") or "/"
    try:
        os.chdir(wd)
    except OSError:
        sys.stderr.write(f"Error: failed to start container: chdir to cwd (\"{wd}\") set in config.json failed: "
                         "no such file or directory\n")
        os._exit(128)
    user = spec.get("user") or {}
    if user.get("groups") or user.get("gid") is not None or user.get("uid") is not None:
        os.setgroups(user.get("groups") or [])  # fsGroup, supplementalGroups
    if user.get("gid") is not None:
        os.setgid(user["gid"])
    if user.get("uid") is not None:
        os.setuid(user["uid"])  # runAsUser: the workload runs as that user, as under runc
    argv = spec["argv"]
    env = spec["env"]
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        sys.stderr.write(f'exec: "{argv[0]}": executable file not found in $PATH: {e.strerror}\n')
        os._exit(127)


MS_REMOUNT = 32
O_PATH = getattr(os, "O_PATH", 0o10000000)
if __name__ == "__main__":
    main()
