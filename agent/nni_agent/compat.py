"""What the agent needs from Pythons older than the manager's: it runs on 3.8 and later.

Workers keep old interpreters (Ubuntu 20.04 and `msranni/nni:latest` ship 3.8), so the agent
avoids newer library calls, and takes these from here; everything else it uses exists in 3.8.
`wait_for` is here for the manager too: asyncio's own swallows a cancellation before 3.12.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import os
from typing import Awaitable, Callable, Optional, TypeVar

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


async def wait_for(aw: Awaitable[T], timeout: Optional[float]) -> T:
    """asyncio.wait_for without its bug before Python 3.12 (gh-86296): a cancellation that lands
    while `aw` has just completed is swallowed there, the result returned as if nothing happened.
    A loop waiting on an event with a timeout then never stops: a cancelled experiment ran its
    trials to the end, and a stopped platform poller kept polling while stop-all waited for it.
    Here a cancellation always propagates (once `aw`, cancelled too, has ended); a timeout cancels
    `aw` and raises asyncio.TimeoutError, unless `aw` completed meanwhile (its result is then kept,
    never lost)."""
    if timeout is None:  # nothing to race: awaited as is (a trial's exit, once per trial)
        return await aw
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.wait({task})  # `aw` has ended when the caller sees its cancellation, as with asyncio's
        raise
    if not done:
        task.cancel()
        await asyncio.wait({task})  # a cancellation of ours propagates from here too
        if task.cancelled():
            raise asyncio.TimeoutError
    return task.result()
