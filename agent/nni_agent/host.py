"""Facts about this worker, sent once in Hello."""
from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import psutil

from nni_agent.v1 import agent_pb2 as pb


def host_info(work_dir: Path) -> pb.HostInfo:
    uname = os.uname()
    return pb.HostInfo(
        hostname=socket.gethostname(),
        os=f"{uname.sysname} {uname.release} {uname.machine}",
        python=f"{sys.version.split()[0]} {sys.executable}",
        cpu_count=os.cpu_count() or 1,
        memory_total=psutil.virtual_memory().total,
        work_dir=str(work_dir),
        pid=os.getpid(),
    )
