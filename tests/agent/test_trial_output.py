"""Logs and metrics of a running trial arrive complete, byte-exact, in order, before the end."""
from __future__ import annotations

import json
from pathlib import Path

from nni_agent.v1 import agent_pb2 as pb
from tests.support.agent.trialkit import python_command, run_trial


def test_non_utf8_output_is_byte_exact(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 4 + b"\xff\xfe no newline at the end"
    (tmp_path / "blob").write_bytes(payload)
    rec, _ = run_trial(tmp_path, f"cat {tmp_path / 'blob'}; cat {tmp_path / 'blob'} >&2")
    assert rec.stdout == payload
    assert rec.stderr == payload


def test_ten_megabyte_line_is_byte_exact_in_bounded_chunks(tmp_path: Path) -> None:
    command = python_command(
        "import sys; out = sys.stdout.buffer; out.write(b'a' * 10_000_000 + b'\\n'); "
        "out.write(b\"NNISDK_MEb'{\\\"type\\\": \\\"FINAL\\\", \\\"value\\\": \\\"1\\\"}'\\n\")")
    rec, _ = run_trial(tmp_path, command, platform="remote")
    assert rec.stdout[:10_000_000] == b"a" * 10_000_000
    assert len(rec.stdout) == 10_000_001 + len(b"NNISDK_MEb'{\"type\": \"FINAL\", \"value\": \"1\"}'\n")
    assert rec.max_chunk <= 64 * 1024
    assert rec.metrics == ['{"type": "FINAL", "value": "1"}']  # scanning resumed after the huge line


def test_carriage_return_progress_lines(tmp_path: Path) -> None:
    command = python_command(
        "import sys\n"
        "for i in range(3): sys.stdout.write(f'progress {i}%\\r')\n"
        "sys.stdout.write(\"NNISDK_MEb'{\\\"type\\\": \\\"PERIODICAL\\\", \\\"value\\\": \\\"0.5\\\"}'\\r\")\n"
        "sys.stdout.write('done\\n')\n")
    rec, _ = run_trial(tmp_path, command)
    assert rec.stdout == (b"progress 0%\rprogress 1%\rprogress 2%\r"
                          b"NNISDK_MEb'{\"type\": \"PERIODICAL\", \"value\": \"0.5\"}'\rdone\n")
    assert rec.metrics == ['{"type": "PERIODICAL", "value": "0.5"}']


def test_stdout_marker_with_quote_inside_json(tmp_path: Path) -> None:
    metric = {"parameter_id": 1, "trial_job_id": "trA01", "type": "FINAL", "sequence": 0,
              "value": json.dumps({"default": 0.9, "note": "it's fine"})}
    command = python_command(f"print(\"NNISDK_MEb'\" + {json.dumps(metric)!r} + \"'\", flush=True)")
    rec, _ = run_trial(tmp_path, command, platform="remote")
    assert [json.loads(m) for m in rec.metrics] == [metric]
    assert rec.metric_values() == [{"default": 0.9, "note": "it's fine"}]


def test_hundred_thousand_file_metrics_in_order_exactly_once(tmp_path: Path) -> None:
    n = 100_000
    command = python_command(
        "from nni_agent import get_next_parameter, report_intermediate_result, report_final_result\n"
        "get_next_parameter()\n"
        f"for i in range({n} - 1): report_intermediate_result(i)\n"
        "report_final_result(-1)\n")
    rec, _ = run_trial(tmp_path, command, timeout=120)
    assert rec.terminal.state == pb.TRIAL_STATE_SUCCEEDED, rec.terminal.reason
    assert len(rec.metrics) == n
    values = rec.metric_values()
    assert values == list(range(n - 1)) + [-1]
    first = json.loads(rec.metrics[0])
    assert first == {"parameter_id": 3, "trial_job_id": "trA01", "type": "PERIODICAL", "sequence": 0, "value": "0"}
    assert json.loads(rec.metrics[-1])["type"] == "FINAL"
    assert rec.events_after_terminal == 0
