"""The container command that starts the agent inside any image with Python >= 3.8.

The manager's own agent wheel arrives as an immutable ConfigMap volume, the token and CA as a
Secret volume; the boot step (nni_agent/boot.py) travels inline in the pod's command, with the
wheel's sha256 (a ConfigMap can be replaced by anyone who may edit ConfigMaps; the pod spec is
the experiment's own). The command finds Python, and the boot step verifies the wheel, unpacks
it into the pod's scratch volume, checks the Python version and the image's agent dependencies
(their versions), and execs the agent. Every problem ends the container with one line in its
termination message, which becomes the trial's `message`. Nothing secret is on the command line.
"""
from __future__ import annotations

from nni_manager.backends.agent_command import AgentCommand
from nni_manager.hub.relay_token import FILE as RELAY_TOKEN_FILE

SECRET_DIR = "/var/run/nni/secret"  # ca.crt and one token file per agent (named for its pod)
WHEEL_DIR = "/var/run/nni/agent"  # the agent wheel (ConfigMap)
WORK_DIR = "/var/run/nni/work"  # emptyDir: unpacked agent, bundles, trial directories
TERMINATION_LOG = "/dev/termination-log"


def agent_command(hub_address: str, tls: bool, orphan_timeout: float, single_trial: bool, *, wheel: str, tag: str,
                  image: str, wheel_sha256: str, relay_token: bool = False) -> AgentCommand:
    """"{agent}" is the pod's name (NNI_AGENT_ID, from the downward API): the agent's id. With
    `relay_token`, the agents dial the hub relay and prove the token in the Secret's relay.token."""
    return AgentCommand(sha256=((wheel, wheel_sha256),),
        agent_id="{agent}", manager=hub_address, token_file=f"{SECRET_DIR}/{{agent}}", work_dir=WORK_DIR,
        orphan_timeout=orphan_timeout, ca_file=f"{SECRET_DIR}/ca.crt" if tls else "", single_trial=single_trial,
        wheel=f"{WHEEL_DIR}/{wheel}", unpack_to=f"{WORK_DIR}/agent-{tag}", where=f"the image {image}",
        message_file=TERMINATION_LOG, agent_id_env="NNI_AGENT_ID",
        relay_token_file=f"{SECRET_DIR}/{RELAY_TOKEN_FILE}" if relay_token else "")


def container_command(command: AgentCommand, prefix: str = "") -> list[str]:
    """`sh -c` that finds Python and runs the boot step; the agent's arguments are the positional
    ones. `prefix` is shell run first (e.g. sourcing FrameworkController's barrier output)."""
    script = command.shell(agent_args='"$@"')  # boot.py inline: nothing a ConfigMap editor can change
    return ["sh", "-c", (f"{prefix} || exit $?\n" if prefix else "") + script, "nni-agent-boot",
            *command.agent_args()]
