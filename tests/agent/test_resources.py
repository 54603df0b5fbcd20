"""CPU and memory of a trial's whole process tree, escaped descendants included."""
from __future__ import annotations

import time
from pathlib import Path

import psutil

from nni_agent.resources import TreeSampler
from nni_agent.v1 import agent_pb2 as pb
from tests.support.agent.trialkit import AGENT_KEY, Recorder, make_spec, new_trial, python_command, run, wait_until

BUSY = "import time\nend = time.time() + 60\nwhile time.time() < end: pass"
HOLD_MEMORY = "import time; block = bytearray(64 * 1024 * 1024); block[::4096] = b'x' * len(block[::4096]); time.sleep(60)"


def _tree_cpu_seconds(root_pid: int) -> float:
    """CPU time (user + system) used so far by the root and its live descendants."""
    total = 0.0
    try:
        procs = [psutil.Process(root_pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return total
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def escaping_daemon(ready: Path) -> str:
    """A command whose child leaves the trial's session (setsid) and touches `ready` once its
    parent is gone (re-parented: the parent exited), so a sample then counts the daemon alone."""
    return python_command(
        "import os, time, pathlib\n"
        "parent = os.getpid()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    while os.getppid() == parent:\n"
        "        time.sleep(0.01)\n"
        f"    pathlib.Path({str(ready)!r}).touch()\n"
        "    time.sleep(60)\n"
        "os._exit(0)\n")


def test_tree_sample_counts_every_process_of_the_trial(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    escaped = escaping_daemon(ready)
    command = f"{python_command(BUSY)} & {python_command(HOLD_MEMORY)} & {escaped}; wait"
    rec = Recorder()
    # the background jobs of `sh -c` ignore the SIGINT a cancel starts with: SIGKILL after 0.5 s, not 5
    spec = make_spec(tmp_path, command, limits=pb.Limits(grace_period_ms=500))

    async def body() -> tuple[list[pb.TrialResources], float]:
        trial = new_trial(spec, tmp_path, rec)
        await trial.start()
        sampler = TreeSampler(trial.root_pid(), f"{AGENT_KEY}/trA01")
        await wait_until(ready.exists)
        await wait_until(lambda: sampler.sample().rss_bytes > 64 * 1024 * 1024, what="the memory to be touched")
        sampler.sample()  # cpu_percent counts from here
        start, burned = time.monotonic(), _tree_cpu_seconds(trial.root_pid())
        await wait_until(lambda: _tree_cpu_seconds(trial.root_pid()) - burned >= 0.3,
                         what="the busy loop to burn 0.3 s of CPU")
        burned, elapsed = _tree_cpu_seconds(trial.root_pid()) - burned, time.monotonic() - start
        samples = [sampler.sample()]
        await trial.cancel(False, "done")
        await trial.wait()
        samples.append(sampler.sample())
        return samples, 100 * burned / elapsed

    (running, after), percent_seen = run(body)
    assert running.trial_id == "trA01"
    assert running.num_processes == 4  # sh, busy loop, memory holder, the escaped daemon
    assert running.rss_bytes > 64 * 1024 * 1024
    assert running.cpu_percent > 5
    assert running.cpu_percent >= 0.5 * percent_seen  # it saw the CPU the tree burned since the last sample
    assert after.num_processes == 0 and after.rss_bytes == 0


def test_samplers_of_one_round_share_a_walk_and_keep_their_own_processes(tmp_path: Path, monkeypatch) -> None:
    """Keeper.resources samples every trial in one loop step: the agent's tree is walked once for
    all of them, and each trial still gets its own processes, its escaped daemon included."""
    import nni_agent.resources as resources

    walks = []
    real_tree = resources._Tree

    def counting_tree() -> resources._Tree:
        walks.append(1)
        return real_tree()

    monkeypatch.setattr(resources, "_Tree", counting_tree)

    def command(ready: Path) -> str:
        escaped = escaping_daemon(ready)
        return f"{python_command('import time; time.sleep(60)')} & {escaped}; wait"

    async def body() -> tuple[list[pb.TrialResources], int, list[pb.TrialResources]]:
        trials, samplers, readies = [], [], []
        for i in range(3):
            ready = tmp_path / f"ready{i}"
            spec = make_spec(tmp_path, command(ready), trial_id=f"tr{i}", limits=pb.Limits(grace_period_ms=500))
            trial = new_trial(spec, tmp_path, Recorder())
            await trial.start()
            trials.append(trial)
            samplers.append(TreeSampler(trial.root_pid(), f"{AGENT_KEY}/tr{i}"))
            readies.append(ready)
        await wait_until(lambda: all(r.exists() for r in readies))
        walks.clear()
        round_one = [s.sample() for s in samplers]  # one loop step: one walk
        one_walk = len(walks)
        for trial in trials:
            await trial.cancel(False, "done")
        for trial in trials:
            await trial.wait()
        return round_one, one_walk, [s.sample() for s in samplers]

    running, one_walk, after = run(body)
    assert one_walk == 1
    assert [r.trial_id for r in running] == ["tr0", "tr1", "tr2"]
    assert [r.num_processes for r in running] == [3, 3, 3]  # sh, the sleeper, the escaped daemon
    assert all(r.num_processes == 0 for r in after)
