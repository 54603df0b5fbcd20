"""Assemble one agent process: reaper, outbox, keeper, HTTP trial channel, connection."""
from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from nni_agent.bundles import BundleCache
from nni_agent.connection import Connection, Timing
from nni_agent.gpu import make_gpu_provider
from nni_agent.guardian import Guardian
from nni_agent.host import host_info
from nni_agent.http_channel import HttpChannelServer
from nni_agent.keeper import Keeper
from nni_agent.outbox import Outbox
from nni_agent.process import child_reaper
from nni_agent.study_storage import StudyStorageServer
from nni_agent.v1 import agent_pb2 as pb

log = logging.getLogger(__name__)


@dataclass
class AgentOptions:
    manager: str  # gRPC target, or "@<path>": a file holding it, re-read before every dial
    agent_id: str
    token: str
    work_dir: Path
    orphan_timeout: float = 0.0
    tls: bool = False  # dial over TLS (trusting `root_certificates`, else the system's CAs)
    root_certificates: bytes | None = None
    server_name: str | None = None  # the name the manager's certificate must carry, if not the dialled host
    single_trial: bool = False  # run one trial, then exit with its outcome
    token_file: Path | None = None  # where the token came from: a session token from enrolment replaces it
    relay_token: str | None = None  # the manager is behind a relay: prove this to it before anything else
    spool_memory_limit: int = 64 << 20
    timing: Timing | None = None

    def __repr__(self) -> str:  # never show the token
        return f"AgentOptions(manager={self.manager!r}, agent_id={self.agent_id!r}, work_dir={str(self.work_dir)!r})"


async def run_agent(options: AgentOptions) -> int:
    """Run until the manager says shut down, refuses us, or stays away past the orphan timeout."""
    loop = asyncio.get_running_loop()
    boot_id = os.urandom(16).hex()
    work_dir = options.work_dir.expanduser().resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    child_reaper()  # reap trial processes (and adopted orphans) on SIGCHLD
    guardian = await Guardian.start(boot_id)  # trials die with the agent, even a SIGKILLed one
    gpu = make_gpu_provider()
    http_channel = HttpChannelServer()  # listens once the first trial needs it
    study_storage = StudyStorageServer()  # likewise, for trials of an Optuna study
    outbox = Outbox(work_dir / "spool" / boot_id, memory_limit=options.spool_memory_limit)
    bundles = BundleCache(work_dir / "bundles")
    connection: Connection | None = None

    def request_bundle(digest: str) -> None:
        assert connection is not None
        connection.request_bundle(digest)

    keeper = Keeper(
        outbox=outbox,
        work_dir=work_dir,
        bundles=bundles,
        agent_key=boot_id,
        request_bundle=request_bundle,
        http_channel=http_channel,
        study_storage=study_storage,
    )
    connection = Connection(
        target=options.manager,
        agent_id=options.agent_id,
        token=options.token,
        boot_id=boot_id,
        keeper=keeper,
        outbox=outbox,
        bundles=bundles,
        host=host_info(work_dir),
        gpu_sample=gpu.sample,
        orphan_timeout=options.orphan_timeout,
        timing=options.timing,
        tls=options.tls,
        root_certificates=options.root_certificates,
        server_name=options.server_name,
        token_file=options.token_file,
        relay_token=options.relay_token,
    )
    study_storage.forward = connection.study_call
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, functools.partial(connection.stop, f"agent received {signal.Signals(sig).name}",
                                                       cause=pb.END_CAUSE_AGENT_SIGNALLED))
    first = gpu.sample()
    log.info("nni-agent %s starting: boot %s, work dir %s, %d GPU(s) via %s %s", options.agent_id, boot_id, work_dir,
             len(first.gpus), first.provider, first.unavailable_reason)
    trim = loop.create_task(_trim_after_connect(connection))
    single = loop.create_task(_exit_after_first_trial(keeper, connection)) if options.single_trial else None
    try:
        return await connection.run()
    finally:
        trim.cancel()
        if single is not None:
            single.cancel()
        http_channel.close()
        await study_storage.close()
        _remove_tree(outbox.spool_dir)
        if guardian is not None:
            await guardian.close()


def trial_exit_code(status: pb.TrialStatus) -> int:
    """A --single-trial agent's exit code: what the job around it reports as the trial's outcome."""
    if status.state == pb.TRIAL_STATE_FAILED:
        return status.exit_code if status.has_exit_code and 0 < status.exit_code < 256 else 1
    return 0


async def _exit_after_first_trial(keeper: Keeper, connection: Connection) -> None:
    status = await keeper.first_end()
    # wait as long as the manager may take to come back: the job's status must follow the
    # trial's only after the manager has every record of it
    connection.stop(f"the trial ended ({pb.TrialState.Name(status.state)})", exit_code=trial_exit_code(status),
                    drain_timeout=connection.orphan_timeout or None, offline_too=True)


async def _trim_after_connect(connection: Connection) -> None:
    """Hand the start-up garbage (imports, TLS of the first dial) back to the OS once: an
    idle agent should cost its worker as little memory as possible."""
    await connection.connected.wait()
    await asyncio.sleep(1.0)
    try:
        ctypes.CDLL(None).malloc_trim(0)  # glibc; elsewhere there is nothing to trim
    except (OSError, AttributeError):
        pass


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
