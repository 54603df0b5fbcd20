"""Records as protobuf wire bytes, written without building messages: the metric path's hot
spots (a trial may report tens of thousands of metrics a second; building a `Metric` and a
`Record` and serialising them was a third of the agent's time for them). Tests check the bytes
against protobuf's own serialisation.
"""
from __future__ import annotations

from nni_agent.v1 import agent_pb2 as pb


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint of `n` >= 0 (one or two bytes for a record's length: inline)."""
    if n < 0x80:
        return bytes((n,))
    if n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def metric_record(seq: int, trial_id: str, trial_seq: int, data: str, time_ms: int) -> bytes:
    """`Record(seq=seq, metric=Metric(trial_id, trial_seq, data, time_ms)).SerializeToString()`:
    Record.seq = 1, Record.metric = 3; Metric.trial_id = 1, trial_seq = 2, data = 3, time_ms = 4."""
    if seq <= 0 or trial_seq <= 0 or time_ms <= 0 or not trial_id or not data:  # proto3 leaves zeros out
        return pb.Record(seq=seq, metric=pb.Metric(trial_id=trial_id, trial_seq=trial_seq, data=data,
                                                   time_ms=time_ms)).SerializeToString()
    tid, body = trial_id.encode(), data.encode()
    metric = (b"\x0a" + varint(len(tid)) + tid + b"\x10" + varint(trial_seq) + b"\x1a" + varint(len(body)) + body
              + b"\x20" + varint(time_ms))
    return b"\x08" + varint(seq) + b"\x1a" + varint(len(metric)) + metric
