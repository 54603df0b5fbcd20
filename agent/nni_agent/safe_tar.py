"""Unpack a tar archive that came over the wire, on every Python the agent supports.

PEP 706's `filter="data"` exists only from 3.11.4 (and the 3.8.17 / 3.9.17 / 3.10.12
security releases); Debian 12's own 3.11.2 and many images and HPC nodes lack it. So the
agent applies the same checks itself, member by member just before each is written (a link
made by an earlier member is then already on disk, so a chain of links cannot lead out),
and passes the filter as a second guard where it exists. Both paths refuse the same
things: absolute names, `..`, links that are absolute or lead out of the target, device
files and FIFOs. Modes lose setuid/setgid/sticky and group/other write bits, files stay
readable and writable by their owner, and ownership is never taken from the archive.
"""
from __future__ import annotations

import os
import tarfile
from pathlib import Path

HAS_DATA_FILTER = hasattr(tarfile, "data_filter")


class UnsafeArchiveError(ValueError):
    """A member would write outside the target or create something other than plain data."""


def extract_all(tar: tarfile.TarFile, dest: Path, *, use_filter: bool = HAS_DATA_FILTER) -> None:
    """Extract every member of `tar` into the existing directory `dest`, or raise
    UnsafeArchiveError naming the first member refused (members before it stay written:
    the caller extracts into a scratch directory and removes it on failure)."""
    root = os.path.realpath(dest)
    for member in tar:
        check_member(member, root)
        if use_filter:
            tar.extract(member, root, filter="data")
        else:
            tar.extract(_sanitized(member), root)


def check_member(member: tarfile.TarInfo, root: str) -> None:
    """Refuse a member unsafe to write under `root` (a resolved path), given what is on disk now."""
    name = member.name
    if name.startswith("/") or os.path.isabs(name):
        raise UnsafeArchiveError(f"{name!r}: absolute path")
    if ".." in name.replace("\\", "/").split("/"):
        raise UnsafeArchiveError(f"{name!r}: '..' in the path")
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeArchiveError(f"{name!r}: special file (device, FIFO or other), not data")
    _inside(root, os.path.join(root, name), name, "leads out of the target")
    if member.issym() or member.islnk():
        link = member.linkname
        if link.startswith("/") or os.path.isabs(link):
            raise UnsafeArchiveError(f"{name!r}: link to an absolute path {link!r}")
        base = os.path.join(root, os.path.dirname(name)) if member.issym() else root
        _inside(root, os.path.join(base, link), name, f"link to {link!r} leads out of the target")


def _inside(root: str, path: str, name: str, why: str) -> None:
    real = os.path.realpath(path)
    if os.path.commonpath([real, root]) != root:
        raise UnsafeArchiveError(f"{name!r}: {why}")


def _sanitized(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """What the data filter would write: safe modes, the extracting user as owner."""
    mode = member.mode & 0o755
    if member.isreg() or member.islnk():
        if not mode & 0o100:
            mode &= ~0o111
        mode |= 0o600
    elif member.isdir():
        mode = 0o755
    member.mode = mode
    member.uid, member.gid = os.getuid(), os.getgid()
    member.uname = member.gname = ""
    return member
