"""What the agent needs from Pythons older than the manager's: it runs on 3.8 and later.

Workers keep old interpreters (Ubuntu 20.04 and `msranni/nni:latest` ship 3.8), so the agent
avoids newer library calls, and takes these two from here; everything else it uses exists in 3.8.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import os
from typing import Callable, TypeVar

from nni_agent.boot import MIN_PYTHON  # the oldest Python the agent runs on; the boot step checks it

T = TypeVar("T")
MIN_PYTHON_TEXT = "%d.%d" % MIN_PYTHON


async def to_thread(func: Callable[..., T], *args: object) -> T:
    """asyncio.to_thread (3.9+): run `func` in the loop's default executor, context kept."""
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, func, *args)
    return await loop.run_in_executor(None, call)


def waitstatus_to_exitcode(status: int) -> int:
    """os.waitstatus_to_exitcode (3.9+): the exit code, or -signal for a killed process."""
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    raise ValueError(f"invalid wait status: {status!r}")
