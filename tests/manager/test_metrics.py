"""nni_manager.metrics: the one decoder and PERIODICAL numberer every reader shares."""
from __future__ import annotations

import json

from nni_manager.metrics import Sequences, checked, metric_number, metric_value, numbered
from nni_manager.webui.views import dumps, metric_record, metric_record_json


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


def test_numbered_is_checked_plus_sequences_row_for_row(caplog) -> None:  # type: ignore[no-untyped-def]
    """The WebUI's fast loop must skip and number exactly as the plain decoder does."""
    rows = [("a", "PERIODICAL", _msg("PERIODICAL", 9, 1), 1), ("a", "REQUEST_PARAMETER", "{}", 2),
            ("b", "PERIODICAL", " " + _msg("PERIODICAL", 1, 2), 3), ("a", "FINAL", _msg("FINAL", 4, 3), 4),
            ("a", "PERIODICAL", '{"sequence": "x"}', 5), ("a", "PERIODICAL", "[]", 6), ("b", "CUSTOM", "{", 7),
            ("b", "PERIODICAL", '{"value": NaN}', 8), ("a", "PERIODICAL", _msg("PERIODICAL", None, 5), 9)]
    plain, seq = [], Sequences()
    for trial, kind, data, stamp in rows:
        message = checked(data)[0]
        if kind != "REQUEST_PARAMETER" and message is not None:
            plain.append((trial, kind, message, stamp, seq.number(trial, kind, message)))
    got = list(numbered(rows, "test"))
    assert [str(g) for g in got] == [str(p) for p in plain]  # str: NaN != NaN
    assert [g[4] for g in got] == [0, 0, 4, 1, 1] and "skipping a malformed stored metric" in caplog.text


def test_record_json_is_the_record_dumped() -> None:
    messages = [{"type": "FINAL", "value": json.dumps({"default": 0.5, "ü": "\u2028\n\"q\""}), "parameter_id": 3},
                {"type": "PERIODICAL", "value": {"default": float("nan")}, "parameter_id": "p-1"},
                {"value": 7}, {"type": None, "value": "é", "parameter_id": None}, {"value": [1, "x"], "parameter_id": 1.5}]
    for message in messages:
        for stamp, sequence in ((1795000000000, 3), (0, -1)):
            assert metric_record_json("t\u00e9\"1", message, stamp, sequence) == \
                dumps(metric_record("t\u00e9\"1", message, stamp, sequence))
