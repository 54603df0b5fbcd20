"""nni_manager.metrics: the one decoder and PERIODICAL numberer every reader shares."""
from __future__ import annotations

import json

from nni_manager.metrics import Sequences, checked, metric_number, metric_value


def _msg(kind: str, sequence: object, value: object) -> str:
    return json.dumps({"type": kind, "sequence": sequence, "value": json.dumps(value)})


def test_periodical_numbered_per_trial_in_arrival_order_finals_keep_theirs() -> None:
    seq = Sequences()
    rows = [("a", "PERIODICAL", 7), ("b", "PERIODICAL", 7), ("a", "PERIODICAL", 3), ("a", "FINAL", 5),
            ("a", "PERIODICAL", 0), ("b", "CUSTOM", None)]
    got = [seq.number(t, k, {"sequence": s}) for t, k, s in rows]
    assert got == [0, 0, 1, 5, 2, 0]
    assert seq.periodical == {"a": 3, "b": 1}


def test_malformed_rows_are_none_never_raised(caplog) -> None:  # type: ignore[no-untyped-def]
    for bad in ("not json", "[1]", '{"type": 3}', '{"sequence": "x"}', '{"sequence": true}',
                json.dumps({"sequence": 1 << 63})):
        assert checked(bad)[0] is None and checked(bad)[1]
        assert metric_value(bad, "test", "t1") is None
    assert "skipping a malformed stored metric of trial t1" in caplog.text


def test_value_decoded_once_and_ranked() -> None:
    assert metric_value(_msg("FINAL", 0, {"default": 0.5, "loss": 2}), "test") == {"default": 0.5, "loss": 2}
    assert metric_value(json.dumps({"type": "FINAL", "value": "plain text"}), "test") == "plain text"
    assert metric_number({"default": 0.5}) == 0.5 and metric_number(3) == 3.0
    assert metric_number(True) is None and metric_number("0.5") is None
