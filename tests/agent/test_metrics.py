"""NNI metric formats: ME%06d records, NNISDK_MEb'..' lines, REQUEST_PARAMETER routing."""
from __future__ import annotations

import json

from nni_agent.logtail import LINE_LIMIT, MarkerScanner
from nni_agent.metrics import MetricFileParser, metric_from_stdout_line, route_metric


def _record(text: str) -> bytes:
    payload = (text + "\n").encode()
    return b"ME%06d%b" % (len(payload), payload)


class Sink:
    def __init__(self) -> None:
        self.metrics: list[str] = []
        self.requests: list[int] = []

    def metric(self, trial_id: str, data: str) -> None:
        self.metrics.append(data)

    def parameter_request(self, trial_id: str, index: int) -> None:
        self.requests.append(index)


def test_file_parser_handles_records_split_anywhere() -> None:
    texts = [json.dumps({"type": "PERIODICAL", "sequence": i, "value": "é" * i}) for i in range(20)]
    data = b"".join(_record(t) for t in texts)
    for step in (1, 3, 7, 64, len(data)):
        parser = MetricFileParser()
        out: list[str] = []
        for i in range(0, len(data), step):
            out += parser.feed(data[i:i + step])
        assert out == texts, step


def test_file_parser_keeps_a_partial_record_for_later() -> None:
    parser = MetricFileParser()
    record = _record('{"a": 1}')
    assert parser.feed(record[:5]) == []
    assert parser.feed(record[5:-1]) == []
    assert parser.feed(record[-1:]) == ['{"a": 1}']


def test_file_parser_resyncs_after_garbage() -> None:
    parser = MetricFileParser()
    assert parser.feed(b"garbage!!" + _record('{"a": 1}')) == ['{"a": 1}']


def test_stdout_line_uses_the_last_quote() -> None:
    line = b"NNISDK_MEb'{\"value\": \"it's\"}'\n"
    assert metric_from_stdout_line(line) == '{"value": "it\'s"}'
    assert metric_from_stdout_line(b"prefix NNISDK_MEb'{}'") == "{}"
    assert metric_from_stdout_line(b"plain output line") is None
    assert metric_from_stdout_line(b"NNISDK_MEb'unterminated") is None


def test_route_metric_passes_json_verbatim_and_intercepts_requests() -> None:
    sink = Sink()
    verbatim = '{"type":"FINAL",  "value": "0.5", "sequence": 0}'
    route_metric(sink, "t", verbatim)
    route_metric(sink, "t", json.dumps({"type": "REQUEST_PARAMETER", "parameter_index": 2, "sequence": 0}))
    route_metric(sink, "t", "not json")
    route_metric(sink, "t", "[1, 2]")
    assert sink.metrics == [verbatim]
    assert sink.requests == [2]


def test_marker_scanner_memory_is_bounded_on_a_huge_line() -> None:
    found: list[str] = []
    scanner = MarkerScanner(found.append)
    chunk = b"x" * 65536
    for _ in range(160):  # 10 MiB without a line end
        scanner.feed(chunk)
        assert len(scanner._line) <= LINE_LIMIT
    scanner.feed(b"NNISDK_MEb'{\"lost\": 1}'\nNNISDK_MEb'{\"kept\": 2}'")
    scanner.finish()
    assert found == ['{"kept": 2}']  # a marker at the end of an overlong line is not a valid metric


def test_marker_scanner_finds_markers_across_chunks_and_line_ends() -> None:
    found: list[str] = []
    scanner = MarkerScanner(found.append)
    stream = b"a\r\nNNISDK_MEb'{\"n\": 1}'\r\rNNISDK_MEb'{\"n\": 2}'\nNNISDK_MEb'{\"n\": 3}'"
    for byte in stream:
        scanner.feed(bytes([byte]))
    scanner.finish()
    assert found == ['{"n": 1}', '{"n": 2}', '{"n": 3}']
