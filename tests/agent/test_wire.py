"""nni_agent.wire writes the same bytes protobuf does, so the manager reads them unchanged."""
from __future__ import annotations

import json

from nni_agent.v1 import agent_pb2 as pb
from nni_agent.wire import metric_record, varint


def test_varint_matches_protobuf() -> None:
    for n in (0, 1, 127, 128, 300, 16383, 16384, 2**35, 2**63 - 1):
        assert varint(n) == pb.Ack(seq=n).SerializeToString()[1:] or n == 0


def test_metric_record_is_protobufs_serialisation() -> None:
    data = json.dumps({"type": "PERIODICAL", "value": json.dumps("é" * 200), "sequence": 3})
    for seq, trial_id, trial_seq, body, time_ms in ((1, "t1", 1, data, 1_795_000_000_000), (2**40, "ü" * 70, 300, "{}", 5),
                                                     (7, "t", 0, data, 0), (3, "", 1, "", 1)):
        want = pb.Record(seq=seq, metric=pb.Metric(trial_id=trial_id, trial_seq=trial_seq, data=body,
                                                   time_ms=time_ms)).SerializeToString()
        got = metric_record(seq, trial_id, trial_seq, body, time_ms)
        assert got == want
        assert pb.Record.FromString(got).metric.data == body
