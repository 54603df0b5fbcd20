"""UI rendering from plain data."""
from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from nni_manager.experiment import ExperimentResult, TrialSummary
from nni_manager.types import TrialJobStatus
from nni_manager.ui import final_summary, fmt_params, trial_table


def trial(tid: str, seq: int, final: float | None, status: TrialJobStatus = TrialJobStatus.SUCCEEDED) -> TrialSummary:
    return TrialSummary(tid, seq, seq, {"lr": 0.000123456, "opt": {"_name": "sgd", "m": 0.9}}, status,
                        latest=0.5, final=final, metric=final, gpu_indices=[0, 1], start_time=1000, end_time=3500)


def test_compact_parameters() -> None:
    assert fmt_params({"lr": 0.000123456, "opt": {"_name": "sgd", "m": 0.9}, "n": 3}) == "lr=0.0001235, opt=sgd(m=0.9), n=3"


def test_table_and_summary() -> None:
    rows = [trial("aaaaa", 0, 0.9), trial("bbbbb", 1, None, TrialJobStatus.FAILED)]
    out = io.StringIO()
    Console(file=out, width=200).print(trial_table(rows, best=rows[0]))
    text = out.getvalue()
    assert "aaaaa *" in text and "FAILED" in text and "0,1" in text and "2.5s" in text
    summary = final_summary(ExperimentResult("exp12345", Path("/x/exp12345"), "maximize", "done", rows, rows[0]))
    assert "Best trial (maximize): aaaaa  metric 0.9" in summary and "Results: /x/exp12345" in summary
    assert "1 failed, 1 succeeded" in summary
