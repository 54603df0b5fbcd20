"""The container command that starts the agent inside any image with Python >= 3.8.

The manager's own agent wheel and the boot step (nni_agent/boot.py) arrive as a ConfigMap volume
(both pure Python and small), the token and CA as a Secret volume; the command finds Python, and
the boot step unpacks the wheel into the pod's scratch volume, checks the Python version and the
image's agent dependencies (their versions), and execs the agent. Every problem ends the
container with one line in its termination message, which becomes the trial's `message`.
Nothing secret is on the command line.
"""
from __future__ import annotations

from nni_manager.backends.agent_command import AgentCommand, boot_source

SECRET_DIR = "/var/run/nni/secret"  # ca.crt and one token file per agent (named for its pod)
WHEEL_DIR = "/var/run/nni/agent"  # the agent wheel and BOOT_FILE (ConfigMap)
WORK_DIR = "/var/run/nni/work"  # emptyDir: unpacked agent, bundles, trial directories
TERMINATION_LOG = "/dev/termination-log"

BOOT_FILE = "boot.py"  # nni_agent/boot.py, beside the wheel in the agent ConfigMap


def boot_file_text() -> str:
    return boot_source()


def agent_command(hub_address: str, tls: bool, orphan_timeout: float, single_trial: bool, *, wheel: str, tag: str,
                  image: str) -> AgentCommand:
    """"{agent}" is the pod's name (NNI_AGENT_ID, from the downward API): the agent's id."""
    return AgentCommand(
        agent_id="{agent}", manager=hub_address, token_file=f"{SECRET_DIR}/{{agent}}", work_dir=WORK_DIR,
        orphan_timeout=orphan_timeout, ca_file=f"{SECRET_DIR}/ca.crt" if tls else "", single_trial=single_trial,
        wheel=f"{WHEEL_DIR}/{wheel}", unpack_to=f"{WORK_DIR}/agent-{tag}", where=f"the image {image}",
        message_file=TERMINATION_LOG, agent_id_env="NNI_AGENT_ID")


def container_command(command: AgentCommand, prefix: str = "") -> list[str]:
    """`sh -c` that finds Python and runs the boot step; the agent's arguments are the positional
    ones. `prefix` is shell run first (e.g. sourcing FrameworkController's barrier output)."""
    script = command.shell(boot_file=f"{WHEEL_DIR}/{BOOT_FILE}", agent_args='"$@"')
    return ["sh", "-c", (f"{prefix} || exit $?\n" if prefix else "") + script, "nni-agent-boot",
            *command.agent_args()]
