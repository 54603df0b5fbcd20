"""nni_agent.compat.wait_for: asyncio.wait_for without the cancellation it swallows before
Python 3.12. The race is replayed step by step: the awaited event is set, the inner wait
completes, and the cancellation lands before the waiting task resumes (a test cancelling an
experiment as its trials' RUNNING woke the experiment's loop: the trials then ran to the end)."""
from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from nni_agent.compat import wait_for


async def _cancel_as_the_event_is_set(wait: Callable[[Awaitable[Any], float], Awaitable[Any]]) -> bool:
    """Whether a task waiting on an event (with a timeout) ends cancelled when cancelled right
    after the event is set and the inner wait has completed."""
    event = asyncio.Event()
    loops = 0

    async def loop_until_cancelled() -> None:
        nonlocal loops
        while True:  # the shape of a poller: wait for a poke or the interval, then work
            loops += 1
            try:
                await wait(event.wait(), 30)
            except asyncio.TimeoutError:
                pass
            event.clear()

    task = asyncio.ensure_future(loop_until_cancelled())
    await asyncio.sleep(0)
    assert loops == 1
    event.set()
    await asyncio.sleep(0)  # the inner event.wait() runs to its end; the waiting task has not resumed
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.5)
    if not done:  # the cancellation was swallowed: the loop waits again
        assert loops == 2
        task.cancel()
        await asyncio.wait({task})
    return bool(done) and task.cancelled()


def test_a_cancellation_that_lands_as_the_event_is_set_cancels() -> None:
    assert asyncio.run(_cancel_as_the_event_is_set(wait_for))


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="asyncio.wait_for keeps the cancellation from 3.12 on")
def test_the_replayed_race_is_the_one_asyncio_wait_for_swallows() -> None:
    """The step-by-step replay above does reach the bug: with asyncio's own wait_for the
    cancellation is lost (so the test above can fail)."""
    assert not asyncio.run(_cancel_as_the_event_is_set(asyncio.wait_for))


def test_a_timeout_raises_and_cancels_what_it_waited_for() -> None:
    async def main() -> None:
        inner = asyncio.ensure_future(asyncio.sleep(30))
        with pytest.raises(asyncio.TimeoutError):
            await wait_for(inner, 0.01)
        assert inner.cancelled()

    asyncio.run(main())


def test_a_result_that_arrives_as_the_timeout_fires_is_kept() -> None:
    """An item a queue.get() took as its wait timed out is returned, never dropped."""
    async def main() -> None:
        queue: asyncio.Queue[int] = asyncio.Queue()

        async def get_then_ignore_cancel() -> int:
            item = await queue.get()
            try:
                await asyncio.sleep(0.05)  # still busy with the item when the timeout cancels it
            except asyncio.CancelledError:
                pass
            return item

        loop = asyncio.get_running_loop()
        loop.call_later(0.01, queue.put_nowait, 7)
        assert await wait_for(get_then_ignore_cancel(), 0.02) == 7

    asyncio.run(main())


def test_results_exceptions_and_no_timeout_pass_through() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    async def main() -> None:
        assert await wait_for(asyncio.sleep(0, result=3), None) == 3
        assert await wait_for(asyncio.sleep(0, result=4), 1) == 4
        with pytest.raises(ValueError, match="boom"):
            await wait_for(fails(), 1)

    asyncio.run(main())


def test_what_it_waited_for_has_ended_when_the_cancellation_arrives() -> None:
    """As with asyncio.wait_for: the caller's clean-up runs after the awaited work's own."""
    async def main() -> None:
        order: list[str] = []

        async def work() -> None:
            try:
                await asyncio.sleep(30)
            finally:
                await asyncio.sleep(0.01)  # its own clean-up takes a moment
                order.append("work ended")

        async def caller() -> None:
            try:
                await wait_for(work(), 30)
            finally:
                order.append("caller cleans up")

        task = asyncio.ensure_future(caller())
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.wait({task})
        assert task.cancelled() and order == ["work ended", "caller cleans up"]

    asyncio.run(main())
