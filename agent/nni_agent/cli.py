"""`nni-agent`: run the trial keeper on this worker and connect it to a manager."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import sys
from pathlib import Path

from nni_agent import __version__
from nni_agent.boot import JOB_DIR_PREFIX, remove_private

TOKEN_ENV = "NNI_AGENT_TOKEN"
_RELAY_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,256}")  # it travels in a URL's userinfo

EPILOG = f"""
The agent dials the manager and keeps one gRPC stream open; the manager never needs a
route to this machine. Trials keep running while the link is down; the agent redials
with backoff and replays every unacknowledged status, metric and log chunk.

Trials: each runs as `/bin/sh -c COMMAND` (`exec COMMAND` for a simple command) in its own session, with NNI's environment
(NNI_PLATFORM, NNI_EXP_ID, NNI_TRIAL_JOB_ID, NNI_SYS_DIR, NNI_OUTPUT_DIR, NNI_TRIAL_SEQ_ID,
NNI_CODE_DIR, CUDA_VISIBLE_DEVICES, NNI_TRIAL_COMMAND_CHANNEL) and parameter.cfg in
NNI_SYS_DIR; stdout/stderr go to trial.stdout/trial.stderr there. Metrics are read from
.nni/metrics, `NNISDK_MEb'...'` stdout lines and NNI 3's HTTP channel, so unmodified NNI
trial code works. Stopping sends the trial's kill signal to its whole tree, waits the grace
period, then SIGKILLs what is left (the agent is a child subreaper: nothing escapes). An agent
that is killed (SIGKILL, the OOM killer) takes its trials along: a small guardian process
started with it kills them.

Token: the per-agent secret is read from the environment variable {TOKEN_ENV} or from
--token-file (never from the command line); {TOKEN_ENV} is removed from the environment
before any trial starts.

Environment variables:
  {TOKEN_ENV}                  the agent's token (unless --token-file is given)
  NNI_AGENT_ARTIFICIAL_GPUS=N      TESTING AID: pretend this machine has N GPUs
  NNI_AGENT_ARTIFICIAL_ACTIVE_GPUS=0,2  TESTING AID: mark those artificial GPUs active
                                   (busy with a process outside the experiment)

Exit codes: 0 stopped by the manager or a signal; 2 refused by the manager (wrong token or
incompatible protocol); 3 manager unreachable for longer than --orphan-timeout; with
--single-trial, the trial's outcome (see there).
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="nni-agent",
        description="Trial-keeper agent: runs NNI trial commands on this worker for an nni-manager.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--manager", metavar="TARGET",
                       help="manager hub address: HOST:PORT or unix:/path/to/hub.sock")
    where.add_argument("--manager-file", type=Path, metavar="PATH",
                       help="a file holding the manager hub address, read again before every redial, so "
                            "whoever started the agent can move the endpoint (a new tunnel port) without "
                            "restarting it or its trials")
    parser.add_argument("--agent-id", required=True, help="this agent's id, as registered with the manager")
    parser.add_argument("--token-file", type=Path, metavar="PATH",
                        help=f"read the token from this file (mode 0600) instead of ${TOKEN_ENV}")
    parser.add_argument("--relay-token-file", type=Path, metavar="PATH",
                        help="the manager is behind a relay (a cluster's hub relay, a Slurm login node's): "
                             "prove to it with the experiment's relay token in this file that this is one of "
                             "the experiment's agents (an HTTP CONNECT preface; the relay drops anyone else)")
    parser.add_argument("--work-dir", type=Path, default=Path("~/nni-experiments/agent"),
                        help="directory for trial directories, code bundles and the record spool "
                             "(default: %(default)s)")
    parser.add_argument("--orphan-timeout", type=float, default=0.0, metavar="SECONDS",
                        help="stop all trials and exit when the manager has been unreachable this long "
                             "(default 0: wait forever)")
    parser.add_argument("--ca-file", type=Path, metavar="PATH",
                        help="dial the manager over TLS and trust only the CA certificate(s) in this PEM file "
                             "(cluster platforms: the experiment's own CA, delivered beside the token)")
    parser.add_argument("--tls", action="store_true",
                        help="dial the manager over TLS, trusting the system's CA certificates")
    parser.add_argument("--server-name", metavar="NAME",
                        help="with TLS: the name the manager's certificate must carry, when it differs from "
                             "the host in the address dialled")
    parser.add_argument("--single-trial", action="store_true",
                        help="run one trial, then exit with its outcome (0 succeeded or stopped, else its exit "
                             "code, 1 at least) once the manager has stored its last record: a job's own status "
                             "(a pod, a TFJob replica, a Slurm job) then follows the trial's")
    parser.add_argument("--log-file", type=Path, metavar="PATH", help="write the agent's own log here (default: stderr)")
    parser.add_argument("--remove-at-exit", type=Path, metavar="DIR",
                        help="the directory made for this agent alone (a job's private directory, "
                             "`mktemp -d .../nni-agent.XXXXXX`: its token, unpacked agent and --work-dir, "
                             "which must be inside it), removed when the agent exits, as a container's files go "
                             "with it; only this user's directory of mode 0700 named nni-agent.* is removed")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--version", action="version", version=f"nni-agent {__version__}")
    return parser.parse_args(argv)


def read_token(token_file: Path | None) -> str:
    """The token from --token-file or the environment; removed from the environment."""
    env_token = os.environ.pop(TOKEN_ENV, "")
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise SystemExit(f"nni-agent: cannot read --token-file {token_file}: {exc.strerror}") from None
    else:
        token = env_token.strip()
    if not token:
        raise SystemExit(f"nni-agent: no token: set {TOKEN_ENV} or pass --token-file")
    return token


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.remove_at_exit is not None:
        job_dir = args.remove_at_exit.expanduser().resolve()
        if not (args.remove_at_exit.name.startswith(JOB_DIR_PREFIX)
                and job_dir in args.work_dir.expanduser().resolve().parents):
            raise SystemExit(f"nni-agent: --remove-at-exit {args.remove_at_exit} must be the agent's own "
                             f"{JOB_DIR_PREFIX}XXXXXX directory (mktemp -d) holding --work-dir {args.work_dir}: "
                             "nothing else is removed")
    try:
        return _run(args)
    finally:
        if args.remove_at_exit is not None:
            remove_private(str(args.remove_at_exit))


def _run(args: argparse.Namespace) -> int:
    token = read_token(args.token_file)
    handler: logging.Handler = logging.FileHandler(args.log_file) if args.log_file else logging.StreamHandler()
    logging.basicConfig(level=args.log_level, handlers=[handler],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from nni_agent.agent import AgentOptions, run_agent  # after logging is set up

    relay_token = None
    if args.relay_token_file is not None:
        try:
            relay_token = args.relay_token_file.read_text().strip()
        except OSError as exc:
            raise SystemExit(f"nni-agent: cannot read --relay-token-file {args.relay_token_file}: {exc.strerror}") from None
        if not relay_token or not _RELAY_TOKEN.fullmatch(relay_token):
            raise SystemExit(f"nni-agent: --relay-token-file {args.relay_token_file} holds no relay token "
                             "(letters, digits, '-' and '_'): the manager writes it; start the agent again")
    root_certificates = None
    if args.ca_file is not None:
        try:
            root_certificates = args.ca_file.read_bytes()
        except OSError as exc:
            raise SystemExit(f"nni-agent: cannot read --ca-file {args.ca_file}: {exc.strerror}") from None
    options = AgentOptions(manager=args.manager or f"@{args.manager_file}", agent_id=args.agent_id, token=token,
                           work_dir=args.work_dir, orphan_timeout=args.orphan_timeout,
                           tls=args.tls or root_certificates is not None, root_certificates=root_certificates,
                           server_name=args.server_name, single_trial=args.single_trial,
                           token_file=args.token_file, relay_token=relay_token)
    return asyncio.run(run_agent(options))


if __name__ == "__main__":
    sys.exit(main())
