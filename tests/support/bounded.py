"""An async test body run with a time limit that says where it hung.

`asyncio.run(asyncio.wait_for(body, N))` bounds a body, but when it fires the failure shows only
the test's own line, and a body whose clean-up then waits (a training service stopping its jobs)
runs on into pytest-timeout, whose dump shows an idle event loop. `run_bounded` prints every
pending task's stack at the limit (where each one waits: the body, the manager's pollers, the
clean-up) and again every 30 s while the cancelled body cleans up, so a rare CI hang is read from
its log instead of guessed at."""
from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")

CLEAN_UP_REPORT_S = 30.0


def run_bounded(body: Awaitable[T], timeout: float = 240.0) -> T:
    """`body` to its end within `timeout` s; past it, the tasks' stacks, then TimeoutError."""
    return asyncio.run(_bounded(body, timeout))


async def _bounded(body: Awaitable[T], timeout: float) -> T:
    task = asyncio.ensure_future(body)
    started = time.monotonic()
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if done:
        return task.result()
    dump_tasks(f"the test body ran past its {timeout:g} s limit; it is cancelled now")
    task.cancel()
    while not (await asyncio.wait({task}, timeout=CLEAN_UP_REPORT_S))[0]:
        dump_tasks(f"the cancelled test body still cleans up, {time.monotonic() - started:.0f} s after its start")
    if not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]  # a failure of its clean-up says more than the limit
    raise TimeoutError(f"the test body ran past its {timeout:g} s limit (the tasks' stacks are in its stderr)")


def dump_tasks(why: str, file: Any = None) -> None:
    """Every pending task of the running loop with the stack it waits in."""
    out = file or sys.stderr
    me = asyncio.current_task()
    print(f"===== {why}: pending tasks =====", file=out)
    for t in asyncio.all_tasks():
        if t is me:
            continue
        print(f"--- {t.get_name()}", file=out)
        for line in await_chain(t.get_coro()):
            print(line, file=out)
    print("===== end of the pending tasks =====", file=out, flush=True)


def await_chain(coro: Any) -> list[str]:
    """Where a suspended coroutine waits, outermost first: each coroutine's file, line and
    function down its `await`s (Task.get_stack shows only the outermost frame), then what the
    innermost one awaits (a future, a sleep)."""
    lines: list[str] = []
    for _ in range(60):
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None:
            lines.append(f'  File "{frame.f_code.co_filename}", line {frame.f_lineno}, in {frame.f_code.co_name}')
        inner = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
        if inner is None:
            break
        if not any(hasattr(inner, a) for a in ("cr_frame", "gi_frame", "ag_frame")):
            if "FutureIter" not in type(inner).__name__:  # a plain future: nothing more to say
                lines.append(f"  awaiting {inner!r}"[:400])
            break
        coro = inner
    return lines
