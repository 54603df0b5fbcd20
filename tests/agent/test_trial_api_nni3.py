"""NNI 3 behaviour of the trial side: a stopped trial gets SIGINT first (KeyboardInterrupt
cleanup and its last metric survive), numpy metric values are encoded as NNI's `nni.dump`
encodes them, and `nni_agent`'s API works under NNI 3's own manager, which delivers parameters
over its HTTP trial channel and writes no parameter.cfg."""
from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from nni_agent.v1 import agent_pb2 as pb
from tests.support.agent.trialkit import PY, REPO_AGENT_DIR, Recorder, make_spec, new_trial, python_command, run, wait_until

CLEANUP_TRIAL = """
import pathlib, time
import nni_agent as nni
p = nni.get_next_parameter()
nni.report_intermediate_result(1)
try:  # ready inside the try: a SIGINT right after it must still find the handler
    pathlib.Path({ready!r}).touch()
    time.sleep(60)
except KeyboardInterrupt:
    pathlib.Path({cleaned!r}).write_text("cleaned up")
    nni.report_final_result(42)
"""


def test_stop_sends_sigint_first_so_cleanup_and_last_metric_survive(tmp_path: Path) -> None:
    ready, cleaned = tmp_path / "ready", tmp_path / "cleaned"
    command = python_command(CLEANUP_TRIAL.format(ready=str(ready), cleaned=str(cleaned)))
    rec = Recorder()
    spec = make_spec(tmp_path, command)  # no kill signal configured: the default is NNI 3's

    async def body() -> None:
        trial = new_trial(spec, tmp_path, rec)
        await trial.start()
        await wait_until(ready.exists, what="the trial to start")
        await trial.cancel(False, "")
        await trial.wait()

    run(body)
    assert cleaned.read_text() == "cleaned up"
    assert rec.metric_values() == [1, 42]  # the metric reported in the except block reached us
    assert rec.terminal.state == pb.TRIAL_STATE_USER_CANCELED


NUMPY_TRIAL = """
import numpy as np
import nni_agent as nni
nni.get_next_parameter()
nni.report_intermediate_result(np.float32(0.5))
nni.report_final_result({"default": np.float64(0.25), "epoch": np.int64(3), "ok": np.bool_(True),
                         "curve": np.arange(3)})
"""


def test_numpy_values_are_encoded_like_nni_dump(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    rec = Recorder()
    spec = make_spec(tmp_path, python_command(NUMPY_TRIAL))

    async def body() -> None:
        trial = new_trial(spec, tmp_path, rec)
        await trial.start()
        await trial.wait()

    run(body)
    assert rec.terminal.state == pb.TRIAL_STATE_SUCCEEDED, rec.stderr
    values = [json.loads(m)["value"] for m in rec.metrics]
    assert json.loads(values[0]) == 0.5
    final = json.loads(values[1])
    assert final == {"default": 0.25, "epoch": 3, "ok": True,
                     "curve": {"__ndarray__": [0, 1, 2], "dtype": "int64", "shape": [3]}}
    try:  # and NNI's own decoder reads it back as NNI's dispatcher would
        import nni
    except ImportError:
        return
    assert nni.load(values[1])["curve"].tolist() == [0, 1, 2]


class _Nni3Channel(BaseHTTPRequestHandler):
    """NNI 3's trial channel as its manager serves it (common/command_channel/http.ts)."""

    received: list[dict[str, Any]] = []
    record = json.dumps({"parameter_id": 5, "parameter_source": "algorithm", "parameters": {"lr": 0.3},
                         "parameter_index": 0})
    pending: list[dict[str, Any]] = []

    def do_PUT(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).received.append(body)
        if body["type"] == "request_parameter":
            type(self).pending.append({"type": "parameter", "parameter": self.record})
        self.send_response(200)
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        if self.pending:
            data = json.dumps(self.pending.pop(0)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self.send_response(408)
            self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_api_under_nni3_manager_uses_http_channel_without_parameter_cfg(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Nni3Channel)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/env/local-env/trA01"
        trial = ("import nni_agent as nni\n"
                 "p = nni.get_next_parameter()\n"
                 "nni.report_intermediate_result(p['lr'] * 2)\n"
                 "nni.report_final_result(p['lr'])\n")
        env = {"PYTHONPATH": REPO_AGENT_DIR, "PATH": "/usr/bin:/bin", "NNI_PLATFORM": "local", "NNI_EXP_ID": "expA",
               "NNI_TRIAL_JOB_ID": "trA01", "NNI_SYS_DIR": str(tmp_path), "NNI_OUTPUT_DIR": str(tmp_path),
               "NNI_TRIAL_COMMAND_CHANNEL": url, "NNI_TRIAL_SEQ_ID": "0"}
        out = subprocess.run([PY, "-c", trial], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
    finally:
        server.shutdown()
    assert _Nni3Channel.received[0] == {"type": "request_parameter"}
    metrics = [json.loads(c["metric"]) for c in _Nni3Channel.received if c["type"] == "metric"]
    assert [(m["type"], m["parameter_id"], json.loads(m["value"])) for m in metrics] == [
        ("PERIODICAL", 5, 0.6), ("FINAL", 5, 0.3)]
    assert not (tmp_path / ".nni" / "metrics").exists()


def test_file_channel_still_used_under_nni_agent_with_http_offered(tmp_path: Path) -> None:
    """nni-agent writes parameter.cfg and offers the HTTP channel too: the faster file channel wins."""
    from nni_agent.http_channel import HttpChannelServer

    http = HttpChannelServer()
    http.start()
    rec = Recorder()
    spec = make_spec(tmp_path, python_command("import nni_agent as nni\nnni.get_next_parameter()\n"
                                              "nni.report_final_result(1)\n"))

    async def body() -> None:
        trial = new_trial(spec, tmp_path, rec, http=http)
        await trial.start()
        await trial.wait()

    try:
        run(body)
    finally:
        http.close()
    assert rec.terminal.state == pb.TRIAL_STATE_SUCCEEDED, rec.stderr
    assert rec.metric_values() == [1]
    assert list((tmp_path / "work").rglob("metrics"))  # the records went through .nni/metrics

