"""The outbox keeps every record until acknowledged, within a memory bound."""
import asyncio

from nni_agent.outbox import Outbox


def _fill(box: Outbox, n: int, size: int = 100) -> None:
    for _ in range(n):
        seq = box.next_seq()
        box.append(seq, seq.to_bytes(8, "big") * (size // 8))


def test_read_after_cursor_and_ack(tmp_path):
    box = Outbox(tmp_path)
    _fill(box, 10)
    first, recs = box.read(after=3, max_records=4)
    assert first == 4 and [int.from_bytes(r[:8], "big") for r in recs] == [4, 5, 6, 7]
    box.ack(5)
    first, recs = box.read(after=0)  # acknowledged records are gone even for an old cursor
    assert first == 6 and len(recs) == 5
    box.ack(10)
    assert box.read(after=0)[1] == [] and box.memory_bytes == 0


def test_spills_to_disk_beyond_memory_limit_and_replays_everything(tmp_path):
    box = Outbox(tmp_path / "spool", memory_limit=2 << 20)
    _fill(box, 60_000, size=200)  # ~12 MB of records
    assert box.memory_bytes <= (2 << 20) + (1 << 20)
    assert box.spilled_segments > 0 and any((tmp_path / "spool").iterdir())
    seen, cursor = [], 0
    while True:
        first, recs = box.read(after=cursor, max_records=5000)
        if not recs:
            break
        seen.extend(int.from_bytes(r[:8], "big") for r in recs)
        cursor = first + len(recs) - 1
    assert seen == list(range(1, 60_001))
    box.ack(60_000)
    assert not any((tmp_path / "spool").iterdir())


def test_out_of_order_append_is_refused(tmp_path):
    box = Outbox(tmp_path)
    try:
        box.append(5, b"x")
    except ValueError as exc:
        assert "expected 1" in str(exc)
    else:
        raise AssertionError("append accepted a seq out of order")


def test_wait_drained(tmp_path):
    async def scenario() -> None:
        box = Outbox(tmp_path)
        _fill(box, 3)
        waiter = asyncio.create_task(box.wait_drained())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        box.ack(3)
        await asyncio.wait_for(waiter, 1)

    asyncio.run(scenario())
