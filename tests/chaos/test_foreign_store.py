"""An experiment directory whose experiment.db is corrupt, someone else's SQLite database, or
another experiment's: the manager refuses it in one clear sentence naming the file, changes
nothing in it, and starts nothing (no hub socket, no agent)."""
from __future__ import annotations

import asyncio
import hashlib
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from nni_manager.service import create_training_service
from nni_manager.store import DB_NAME, Store


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _garbage(db: Path) -> None:
    db.write_bytes(b"this is not a database\n" * 300)


def _truncated(db: Path) -> None:
    """A real experiment database cut short (a copy interrupted half-way)."""
    store = Store.open(db.parent)
    with store.transaction():
        store.init_experiment("Other123", {}, 0)
        for i in range(200):
            store.add_metric(f"t{i}", "a", "b", i, i, '{"type": "FINAL", "sequence": 0, "value": "1"}' * 20, 0)
    store.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 3])


def _foreign(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE users (name TEXT, email TEXT)")
    conn.execute("INSERT INTO users VALUES ('alice', 'alice@example.com')")
    conn.commit()
    conn.close()


def _other_experiment(db: Path) -> None:
    store = Store.open(db.parent)
    with store.transaction():
        store.init_experiment("Other123", {}, 0)
    store.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


@pytest.mark.parametrize("spoil, words", [
    (_garbage, "is not an nni-manager experiment database"),
    (_truncated, "is not an nni-manager experiment database"),
    (_foreign, "is not an nni-manager experiment database"),
    (_other_experiment, "belongs to experiment Other123"),
])
def test_corrupt_or_foreign_store_is_refused(make_config: Callable, short_dir: Path, spoil: Callable[[Path], None],
                                            words: str) -> None:
    exp_dir = short_dir / "exps" / "Mine1234"
    exp_dir.mkdir(parents=True)
    db = exp_dir / DB_NAME
    spoil(db)
    before = _digest(db)

    async def body() -> None:
        ts = create_training_service(make_config(), experiment_id="Mine1234")
        with pytest.raises(Exception) as info:
            await ts.start()
        message = str(info.value)
        print(type(info.value).__name__, message)
        assert str(db) in message and words in message, message
        assert "\n" not in message and "Traceback" not in message

    asyncio.run(body())
    assert _digest(db) == before  # nothing written into it
    assert not (exp_dir / "hub.sock").exists() and not (exp_dir / "agents").exists()
    shutil.rmtree(exp_dir)
