"""Trial processes: spawn in their own session, reap on SIGCHLD, kill whole trees.

The agent is a child subreaper (Linux), so a trial's daemonised grandchildren are
re-parented to the agent instead of init and cannot escape the tree kill. Every trial
process carries the marker variable MARKER_ENV=<agent_key>/<trial_id>, which finds
descendants that left the trial's process group or session. If the agent itself is killed,
its guardian (guardian.py) kills what carries its marker.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

from nni_agent.compat import to_thread

log = logging.getLogger(__name__)

MARKER_ENV = "NNI_AGENT_TRIAL_KEY"
PR_SET_CHILD_SUBREAPER = 36
KILL_POLL_S = 0.05
KILL_GIVE_UP_S = 30.0  # SIGKILL retries before reporting survivors and moving on
_ORPHAN_STATUS_TTL_S = 60.0


def make_subreaper() -> bool:
    """Make this process adopt orphaned descendants (Linux); returns whether it worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class ChildReaper:
    """Reaps every child of the agent with waitpid(-1) on SIGCHLD, on one asyncio loop.

    Exit statuses go to futures registered by pid. Statuses of pids nobody registered yet
    (a child can exit before its pid is registered; adopted orphans never are) are kept
    briefly so a late registration still finds them.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiters: dict[int, asyncio.Future[int]] = {}
        self._unclaimed: dict[int, tuple[int, float]] = {}  # pid -> (wait status, monotonic time)

    def install(self) -> None:
        make_subreaper()
        self._loop.add_signal_handler(signal.SIGCHLD, self.reap)
        self.reap()  # children that exited before the handler existed

    def wait_for(self, pid: int) -> asyncio.Future[int]:
        """A future for the raw wait status of child `pid`."""
        future = self._loop.create_future()
        found = self._unclaimed.pop(pid, None)
        if found is not None:
            future.set_result(found[0])
        else:
            self._waiters[pid] = future
        return future

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _roots.pop(pid, None)
            future = self._waiters.pop(pid, None)
            if future is None:
                self._unclaimed[pid] = (status, time.monotonic())
            elif not future.done():
                future.set_result(status)
        cutoff = time.monotonic() - _ORPHAN_STATUS_TTL_S
        for pid in [p for p, (_, t) in self._unclaimed.items() if t < cutoff]:
            del self._unclaimed[pid]


_reapers: dict[asyncio.AbstractEventLoop, ChildReaper] = {}


def child_reaper() -> ChildReaper:
    """The reaper of the running loop, installed on first use (main thread only)."""
    loop = asyncio.get_running_loop()
    reaper = _reapers.get(loop)
    if reaper is None:
        for old in [lp for lp in _reapers if lp.is_closed()]:
            del _reapers[old]
        reaper = ChildReaper(loop)
        reaper.install()
        _reapers[loop] = reaper
    return reaper


# a simple command's first word that `exec` cannot run: the shell's builtins and keywords
_NOT_EXECUTABLE = frozenset(
    "! . : [ alias bg break case cd command continue do done echo elif else esac eval exec exit export false fg fi "
    "for getopts hash if jobs kill local printf pwd read readonly return set shift test then times trap true type "
    "ulimit umask unalias unset until wait while { } source".split())


def shell_line(command: str) -> str:
    """The line `/bin/sh -c` runs: a simple command (`python train.py --lr 0.1`, NNI's usual
    trialCommand) gets `exec `, so the trial replaces the shell rather than running under it (one
    process less per trial, signals and exit status straight from the trial; dash does not do this
    by itself). Lists, pipes, redirections, assignments and builtins run as written."""
    if "\n" in command or "\\" in command:
        return command
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)  # operators only where unquoted
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # unbalanced quotes: the shell's own error
        return command
    if (not words or any(set(w) <= set("();<>|&") for w in words) or "=" in words[0]
            or words[0] in _NOT_EXECUTABLE or command.lstrip().startswith("#")):
        return command
    return "exec " + command


def spawn_shell(command: str, *, cwd: Path, env: Mapping[str, str], stdout: Path, stderr: Path) -> int:
    """Start `/bin/sh -c command` (`shell_line`) in a new session, output straight into files
    (created empty, or emptied: a trial's output starts with its run); returns its pid.

    The child is reaped by ChildReaper, never by subprocess (its Popen is dropped marked done).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
    out = os.open(stdout, flags, 0o666)
    try:
        err = os.open(stderr, flags, 0o666)
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", shell_line(command)],
                cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True, close_fds=True,
            )
        finally:
            os.close(err)
    finally:
        os.close(out)
    proc.returncode = 0  # keeps subprocess' own cleanup from ever waiting for this pid
    marker = env.get(MARKER_ENV)
    if marker:
        _roots[proc.pid] = marker
    return proc.pid


# root pid -> marker of the trials spawn_shell started that are not reaped yet: tree_members skips
# the other trials' subtrees (their processes are in their own sessions, with their own marker)
_roots: dict[int, str] = {}


def marker_of(proc: psutil.Process) -> str | None:
    """The marker `proc` carries (None: none, or unreadable now), read from its environment
    once in its life: psutil.Process hashes by pid and start time, so a recycled pid is
    another key. Kill walks and resource sampling share the cache."""
    try:
        return _MARKERS[proc]
    except KeyError:
        pass
    try:
        value = proc.environ().get(MARKER_ENV)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None  # not kept: a zombie may be a process seen alive, and the next look retries
    if len(_MARKERS) > 4096:  # bounded, should forget_markers not run (no sampling)
        _MARKERS.clear()
    _MARKERS[proc] = value
    return value


def forget_markers(alive: set[psutil.Process]) -> None:
    """Drop the cached markers of processes that are gone."""
    for proc in [p for p in _MARKERS if p not in alive]:
        _MARKERS.pop(proc, None)


_MARKERS: dict[psutil.Process, str | None] = {}


def _children(pid: int) -> list[int] | None:
    """`pid`'s children from /proc/<pid>/task/<tid>/children; None where the kernel does not
    offer the files (or `pid` is gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    kids: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                kids.extend(int(k) for k in f.read().split())
        except FileNotFoundError:
            if not kids and tid == tids[0]:
                return None
        except OSError:
            continue
    return kids


def children_map(root: int) -> dict[int, list[int]] | None:
    """pid -> child pids for `root` and its descendants: cost grows with the tree, not with
    every process on the machine. None where the kernel does not offer the files."""
    edges: dict[int, list[int]] = {}
    stack = [root]
    while stack:
        pid = stack.pop()
        kids = _children(pid)
        if kids is None:
            if pid == root:
                return None
            continue
        edges[pid] = kids
        stack.extend(kids)
    return edges


def walk(edges: dict[int, list[int]], root: int) -> list[int]:
    """The descendants of `root` in a children_map (not `root` itself)."""
    found: list[int] = []
    stack = list(edges.get(root, ()))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(edges.get(pid, ()))
    return found


def _descendant_pids(root: int) -> list[int] | None:
    edges = children_map(root)
    return None if edges is None else walk(edges, root)


def descendants(pid: int | None = None) -> list[psutil.Process]:
    """Live descendants of `pid` (default: this agent)."""
    pid = os.getpid() if pid is None else pid
    pids = _descendant_pids(pid)
    if pids is None:  # no /proc/*/task/*/children: psutil scans every process instead
        try:
            return psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
    return _processes(pids)


def tree_members(pgid: int, marker: str) -> list[psutil.Process]:
    """Live (non-zombie) processes of a trial: the agent's descendants in the trial's
    process group or carrying its marker. The agent is a subreaper, so every process a
    trial ever started is still one of its descendants."""
    members = []
    for proc in _candidates(marker):
        try:
            if not (_pgid(proc) == pgid or marker_of(proc) == marker):
                continue
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            members.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return members


def _candidates(marker: str) -> list[psutil.Process]:
    """The agent's descendants that may belong to trial `marker`: all of them but the subtrees
    of other live trials (O(this trial's processes + orphans), not O(every trial's))."""
    me = os.getpid()
    children = _children(me)
    if children is None:
        return descendants()
    pids: list[int] = []
    for child in children:
        if _roots.get(child, marker) != marker:
            continue  # another live trial's root: its tree is its own
        pids.append(child)
        pids.extend(_descendant_pids(child) or ())
    return _processes(pids)


def _processes(pids: list[int]) -> list[psutil.Process]:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return procs


def _pgid(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except ProcessLookupError:
        return None


def _signal_all(procs: list[psutil.Process], pgid: int, sig: int) -> None:
    """Signal every process exactly once: a second SIGTERM can land while a trial is already
    exiting through its handler (Python restores default handlers at shutdown) and kill it."""
    in_group = [proc for proc in procs if _pgid(proc) == pgid]
    if in_group:  # the group still exists: its id is not reused
        try:
            os.killpg(pgid, sig)  # also hits children forked since the listing
        except (ProcessLookupError, PermissionError):
            pass
    for proc in procs:
        if proc in in_group:
            continue
        try:
            proc.send_signal(sig)  # psutil checks create_time first: no PID-reuse accidents
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


def _signal_tree(pgid: int, marker: str, sig: int) -> list[psutil.Process]:
    """List the trial's processes and signal them; returns the list (empty: none was left)."""
    members = tree_members(pgid, marker)
    if members:
        _signal_all(members, pgid, sig)
    return members


async def kill_tree(pgid: int, marker: str, sig: int, grace_s: float, sent: asyncio.Event | None = None) -> None:
    """Send `sig` to the whole trial tree, wait up to `grace_s`, then SIGKILL until none is left;
    `sent` is set once the first signal went out.

    The /proc walks and the signalling run in a worker thread: they grow with the tree and
    the machine's load, and the loop carries every other trial's records meanwhile."""
    try:
        found = await to_thread(_signal_tree, pgid, marker, sig)
    finally:
        if sent is not None:
            sent.set()
    if not found:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        await asyncio.sleep(KILL_POLL_S)
        if not await to_thread(tree_members, pgid, marker):
            return
    give_up = time.monotonic() + KILL_GIVE_UP_S
    while members := await to_thread(_signal_tree, pgid, marker, signal.SIGKILL):
        if time.monotonic() > give_up:  # e.g. stuck in uninterruptible I/O: do not hang the trial's end
            log.error("trial %s: %d process(es) survive SIGKILL: %s", marker, len(members),
                      ", ".join(str(p.pid) for p in members))
            return
        log.info("SIGKILL %d leftover process(es) of trial %s", len(members), marker)
        await asyncio.sleep(KILL_POLL_S)
