"""Store: round trips, read-only access for the CLI, agents' progress."""
from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from nni_manager.store import Store
from nni_manager.types import TrialJobDetail, TrialJobStatus
from tests.support.manager.helpers import form


def test_trials_metrics_and_readonly(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    with store.transaction():
        store.init_experiment("AbCdEfGh", {"trial_command": "python t.py"}, 1000)
        t = TrialJobDetail(id="aB3de", status=TrialJobStatus.WAITING, submit_time=5, form=form(7, x=1),
                           sequence_id=7, message="waiting for an agent to connect")
        store.save_trial(t)
        store.add_event(t.id, t.status, t.message, 5)
        store.add_parameter(t.id, 0, t.form.hyper_parameters.value)
    t.status, t.agent_id, t.gpu_indices, t.start_time = TrialJobStatus.RUNNING, "local", [0, 1], 9
    with store.transaction():
        store.save_trial(t)
        store.add_metric("aB3de", "local", "boot1", 4, 1, '{"type": "PERIODICAL", "sequence": 0, "value": "1"}', 11)
        store.add_metric("aB3de", "local", "boot1", 5, 2, '{"type": "FINAL", "sequence": 0, "value": "2"}', 12)
        store.add_metric("zz999", "local", "boot1", 6, 1, "not json", 13)
    ro = Store.open_readonly(tmp_path)
    assert ro.experiment()["id"] == "AbCdEfGh"
    assert ro.experiment()["config"] == {"trial_command": "python t.py"}
    [back] = ro.trials()
    assert back == t
    assert [m["type"] for m in ro.metrics("aB3de")] == ["PERIODICAL", "FINAL"]
    assert ro.metrics()[-1] == {"trial_id": "zz999", "type": "CUSTOM", "sequence": 0, "data": "not json",
                                "timestamp": 13}
    with pytest.raises(sqlite3.OperationalError):
        ro.set_experiment_status("STOPPED")
    ro.close()
    store.close()


def test_transaction_rolls_back(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    with pytest.raises(RuntimeError), store.transaction():
        store.add_metric("aB3de", "a", "b", 1, 1, "{}", 1)
        raise RuntimeError("boom")
    assert store.metrics() == []
    store.close()


def test_agent_progress(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.add_agent("local", "local", "secret", {"use_active_gpu": False})
    store.set_agent_progress("local", "boot9", 42)
    store.set_next_cmd_seq("local", 7)
    store.close()
    with closing(Store.open(tmp_path)) as reopened:
        again = reopened.agent_by_name("local")
    assert again is not None
    assert (again["boot_id"], again["applied_seq"], again["next_cmd_seq"]) == ("boot9", 42, 7)
    assert again["hints"] == {"use_active_gpu": False}


def test_readonly_missing_dir_says_so(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="experiment directory"):
        Store.open_readonly(tmp_path / "nope")


def test_experiment_directory_and_database_are_private(tmp_path) -> None:
    import stat

    exp = tmp_path / "exps" / "Private1"
    Store.open(exp).close()
    assert stat.S_IMODE(exp.stat().st_mode) == 0o700  # tokens and the hub socket live here
    assert stat.S_IMODE((exp / "experiment.db").stat().st_mode) & 0o077 == 0
