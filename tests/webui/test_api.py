"""REST contract: NNI 3.0's payload shapes (shared/reference/nni-webui-rest.md §2-3) from a store."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from nni_manager.types import TrialJobStatus as S

from tests.support.webui.fixtures import T0, ServerThread, Synthetic, get_json, http, needs_nni

TRIAL_KEYS = {"trialJobId", "status", "hyperParameters", "startTime", "logPath", "sequenceId", "endTime",
              "message", "finalMetricData", "stderrPath"}
METRIC_KEYS = ["timestamp", "trialJobId", "parameterId", "type", "sequence", "data"]
RECORD_KEYS = {"parameter_id", "parameter_source", "parameters", "parameter_index", "placement_constraint",
               "version_info"}


def _mixed(directory: Path) -> None:
    """Five trials of every kind, NaN and non-ASCII included, a sequence gap to be closed; the
    store is closed again (the server reads the directory)."""
    s = Synthetic(directory)
    s.trial("Succ1", S.SUCCEEDED, {"x": 1, "lr": 0.07102170416433433}, intermediates=[{"default": 2.0, "loss": 1.0}, 3.5],
            final={"default": 0.2, "loss": 0.5})
    s.trial("NaNf2", S.SUCCEEDED, {"x": 2, "lr": 0.001}, intermediates=["NaN"], final="NaN")
    s.trial("Fail3", S.FAILED, {"x": 3, "lr": 0.01}, message="exit code 3: Fehler ✗", intermediates=[1, 2, 3],
            sequences=[0, 2, 5])
    s.trial("Early", S.EARLY_STOPPED, {"x": "β", "lr": 0.02}, intermediates=[0.5],
            record_extra={"trial_job_id": "Early", "placement_constraint": {"type": "None", "gpus": []}})
    s.trial("Runn5", S.RUNNING, {"x": 1, "lr": 0.03}, intermediates=[0.1, 0.2])
    s.logs("Succ1", b"hello \xc3\xa4\n", b"")
    s.logs("Fail3", b"", b"Traceback: boom\n")
    s.store.close()


def test_trial_jobs_and_metrics_have_nni_shapes(tmp_path: Path) -> None:
    _mixed(tmp_path / "synth001")
    with ServerThread(tmp_path / "synth001") as srv:
        status, ctype, body = http(srv.api + "/trial-jobs")
        assert status == 200 and ctype.startswith("application/json")
        assert "größe".encode() not in body and "Fehler ✗".encode() in body  # UTF-8 as is, no \\u escapes
        jobs = json.loads(body)
        assert [j["trialJobId"] for j in jobs] == ["Succ1", "NaNf2", "Fail3", "Early", "Runn5"]
        by_id = {j["trialJobId"]: j for j in jobs}
        for j in jobs:
            assert set(j) <= TRIAL_KEYS and "envId" not in j
            assert isinstance(j["startTime"], int) and isinstance(j["sequenceId"], int)
            (hp,) = j["hyperParameters"]
            record = json.loads(hp)
            assert set(record) <= RECORD_KEYS and record["parameter_index"] == 0
            assert ", " not in hp and ": " not in hp  # compact, as JSON.stringify
        assert json.loads(by_id["Early"]["hyperParameters"][0])["placement_constraint"] == {"type": "None", "gpus": []}
        assert "trial_job_id" not in by_id["Early"]["hyperParameters"][0]
        assert json.loads(by_id["Early"]["hyperParameters"][0])["parameters"]["x"] == "β"
        # finalMetricData only on SUCCEEDED, stderrPath only on FAILED, endTime only once ended
        assert "finalMetricData" in by_id["Succ1"] and "finalMetricData" in by_id["NaNf2"]
        assert all("finalMetricData" not in by_id[i] for i in ("Fail3", "Early", "Runn5"))
        assert by_id["Fail3"]["stderrPath"] == by_id["Fail3"]["logPath"] + "/stderr"
        assert "stderrPath" not in by_id["Succ1"] and "endTime" not in by_id["Runn5"]
        assert by_id["Fail3"]["message"] == "exit code 3: Fehler ✗" and "message" not in by_id["Succ1"]
        (final,) = by_id["Succ1"]["finalMetricData"]
        assert list(final) == METRIC_KEYS
        assert final["parameterId"] == "0" and final["type"] == "FINAL"
        assert json.loads(json.loads(final["data"])) == {"default": 0.2, "loss": 0.5}
        assert by_id["NaNf2"]["finalMetricData"][0]["data"] == '"NaN"'

        metrics = get_json(srv.api + "/metric-data")
        assert all(list(m) == METRIC_KEYS and isinstance(m["parameterId"], str) for m in metrics)
        first = metrics[0]
        assert first["data"] == '"{\\"default\\": 2.0, \\"loss\\": 1.0}"'  # NNI's observed bytes
        fail_seq = [m["sequence"] for m in metrics if m["trialJobId"] == "Fail3"]
        assert fail_seq == [0, 1, 2]  # the reported 0, 2, 5 made dense: the WebUI indexes by sequence
        finals = get_json(srv.api + "/metric-data?type=FINAL")
        assert [m["trialJobId"] for m in finals] == ["Succ1", "NaNf2"]
        one = get_json(srv.api + "/metric-data/Runn5")
        assert [(m["type"], m["sequence"]) for m in one] == [("PERIODICAL", 0), ("PERIODICAL", 1)]
        assert get_json(srv.api + "/metric-data/nope0") == []

        single = get_json(srv.api + "/trial-jobs/Fail3")
        assert single == by_id["Fail3"]
        status, _, body = http(srv.api + "/trial-jobs/NOPE1")
        assert status == 200 and body == b""  # NNI answers undefined as an empty 200
        assert [j["trialJobId"] for j in get_json(srv.api + "/trial-jobs?status=FAILED")] == ["Fail3"]


def test_latest_range_export_statistics(tmp_path: Path) -> None:
    _mixed(tmp_path / "synth001")
    with ServerThread(tmp_path / "synth001") as srv:
        latest = get_json(srv.api + "/metric-data-latest/")
        assert [(m["trialJobId"], m["type"], m["sequence"]) for m in latest] == [
            ("Succ1", "FINAL", 0), ("Succ1", "PERIODICAL", 1), ("NaNf2", "FINAL", 0), ("NaNf2", "PERIODICAL", 0),
            ("Fail3", "PERIODICAL", 2), ("Early", "PERIODICAL", 0), ("Runn5", "PERIODICAL", 1)]
        assert get_json(srv.api + "/metric-data-latest") == latest
        in_range = get_json(srv.api + "/metric-data-range/1/2")  # inclusive at both ends
        assert {m["trialJobId"] for m in in_range} == {"NaNf2", "Fail3"}
        assert get_json(srv.api + "/metric-data-range/7/9") == []

        export = get_json(srv.api + "/export-data")
        assert export[0] == {"parameter": {"x": 1, "lr": 0.07102170416433433},
                             "value": '{"default": 0.2, "loss": 0.5}', "trialJobId": "Succ1"}
        assert [e["trialJobId"] for e in export] == ["Succ1", "NaNf2"] and export[1]["value"] == "NaN"
        stats = get_json(srv.api + "/job-statistics")
        assert {s["trialJobStatus"]: s["trialJobNumber"] for s in stats} == {
            "SUCCEEDED": 2, "FAILED": 1, "EARLY_STOPPED": 1, "RUNNING": 1}


def test_experiment_profile_status_and_misc(tmp_path: Path, home: Path) -> None:
    _mixed(tmp_path / "synth001")
    with ServerThread(tmp_path / "synth001") as srv:
        assert get_json(srv.api + "/check-status") == {"status": "VIEWED", "errors": []}
        profile = get_json(srv.api + "/experiment")
        assert profile["id"] == "synth001" and profile["startTime"] == T0 and profile["nextSequenceId"] == 5
        assert profile["logDir"] == str(tmp_path / "synth001") and isinstance(profile["execDuration"], int)
        params = profile["params"]
        assert params["searchSpace"]["lr"] == {"_type": "loguniform", "_value": [1e-4, 0.1]}
        assert params["trainingService"]["platform"] == "local" and params["maxExperimentDuration"] == "3600s"
        assert params["tuner"] == {"name": "Random", "classArgs": {"optimize_mode": "maximize"}}
        assert params["experimentName"] == "größe 实验" and params["maxTrialNumber"] == 200
        meta = get_json(srv.api + "/experiment-metadata")
        assert meta["id"] == "synth001" and meta["tag"] == [] and meta["status"] == "VIEWED"
        assert [e["id"] for e in get_json(srv.api + "/experiments-info")] == ["synth001"]
        status, _, body = http(srv.api + "/version")
        assert status == 200 and body and not body.startswith(b"{")
        assert get_json(srv.api + "/tensorboard-tasks") == [] and get_json(srv.api + "/experiment/imported-data") == []
        # writes on a stored experiment: NNI's readonly error shape
        status, _, body = http(srv.api + "/experiment?update_type=TRIAL_CONCURRENCY", "PUT",
                               {**profile, "params": {**params, "trialConcurrency": 9}})
        assert status == 500 and json.loads(body) == {"error": "Error: can not update experiment profile in readonly mode!"}
        status, _, body = http(srv.api + "/trial-jobs/Runn5", "DELETE")
        assert status == 500 and "readonly" in json.loads(body)["error"]
        status, _, body = http(srv.api + "/no-such-thing")
        assert status == 404 and "error" in json.loads(body)


def test_zero_and_one_trial(tmp_path: Path) -> None:
    s = Synthetic(tmp_path / "synth001")
    with ServerThread(tmp_path / "synth001") as srv:
        for path in ("/trial-jobs", "/metric-data", "/metric-data-latest", "/export-data", "/job-statistics"):
            assert get_json(srv.api + path) == [], path
        s.trial("Only1", S.SUCCEEDED, {"x": 1}, intermediates=[1], final=1)  # written while served
        (job,) = get_json(srv.api + "/trial-jobs")
        assert job["trialJobId"] == "Only1" and json.loads(json.loads(job["finalMetricData"][0]["data"])) == 1
        assert len(get_json(srv.api + "/metric-data-latest")) == 2
        s.add_metric("Only1", "PERIODICAL", 1, 7)  # only the new row is read: the latest moves on
        latest = get_json(srv.api + "/metric-data-latest")
        assert latest[-1]["sequence"] == 1 and json.loads(json.loads(latest[-1]["data"])) == 7
    s.store.close()


def test_150_trials_range_chunks_cover_every_metric(tmp_path: Path) -> None:
    s = Synthetic(tmp_path / "synth001")
    for i in range(150):
        s.trial(f"t{i:04d}", S.SUCCEEDED if i % 7 else S.FAILED, {"x": i}, intermediates=[i, i + 1],
                final=float("nan") if i == 3 else i)
    with ServerThread(tmp_path / "synth001") as srv:
        assert len(get_json(srv.api + "/trial-jobs")) == 150
        whole = get_json(srv.api + "/metric-data")
        chunks = []
        for low in range(0, 150, 20):  # what the WebUI asks for past 100 trials
            chunks += get_json(srv.api + f"/metric-data-range/{low}/{low + 19}")
        key = lambda m: (m["trialJobId"], m["type"], m["sequence"])  # noqa: E731
        assert sorted(map(key, chunks)) == sorted(map(key, whole)) and len(whole) == 150 * 3
        latest = get_json(srv.api + "/metric-data-latest")
        assert len(latest) == 300
        nan = next(m for m in latest if m["trialJobId"] == "t0003" and m["type"] == "FINAL")
        assert nan["data"] == '"NaN"'
        # the browser's cache revalidates unchanged ranges: 304 without a query
        import urllib.request

        def ranged(etag: str | None) -> tuple[int, str]:
            req = urllib.request.Request(srv.api + "/metric-data-range/20/39",
                                         headers={"If-None-Match": etag} if etag else {})
            try:
                with urllib.request.urlopen(req) as r:
                    return r.status, r.headers["ETag"]
            except urllib.error.HTTPError as exc:
                return exc.code, exc.headers["ETag"]

        status, etag = ranged(None)
        assert status == 200 and ranged(etag) == (304, etag)
        s.add_metric("t0025", "PERIODICAL", 2, 9)  # new data in the range: a full answer again
        status, fresh = ranged(etag)
        assert status == 200 and fresh != etag
        assert ranged(None)[1] == fresh and ranged(fresh)[0] == 304
    s.store.close()


def test_trial_file_names_and_traversal(tmp_path: Path) -> None:
    _mixed(tmp_path / "synth001")
    secret = tmp_path / "secret.txt"
    secret.write_text("do not serve")
    with ServerThread(tmp_path / "synth001") as srv:
        status, ctype, body = http(srv.api + "/trial-file/Succ1/stdout")
        assert status == 200 and ctype.startswith("text/plain") and body == "hello ä\n".encode()
        assert http(srv.api + "/trial-file/Succ1/trial.log")[2] == "hello ä\n".encode()  # no trial.log: stdout
        assert http(srv.api + "/trial-file/Succ1/stderr")[2] == b"stderr is empty."
        assert http(srv.api + "/trial-file/Fail3/stderr")[2] == b"Traceback: boom\n"
        status, _, body = http(srv.api + "/trial-file/Early/stdout")
        assert status == 500 and "error" in json.loads(body)
        assert http(srv.api + "/trial-file/NOPE1/stdout")[0] == 404
        for evil in ("..%2F..%2F..%2Fsecret.txt", "..", "%2E%2E", "..%2Fsynth001%2Fexperiment.db",
                     "trial.stdout%00", ".%2F..%2F..%2Fsecret.txt"):
            status, _, body = http(srv.api + f"/trial-file/Succ1/{evil}")
            assert status != 200 and b"do not serve" not in body and b"SQLite" not in body, evil
        status, _, body = http(srv.url + "..%2F..%2Fsecret.txt")
        assert b"do not serve" not in body


@needs_nni
def test_nni_python_client_accepts_every_payload(tmp_path: Path) -> None:
    from nni.experiment.data import TrialJob, TrialMetricData, TrialResult

    _mixed(tmp_path / "synth001")
    with ServerThread(tmp_path / "synth001") as srv:
        jobs = [TrialJob(**j) for j in get_json(srv.api + "/trial-jobs")]  # raises on a key NNI rejects
        assert [j.trialJobId for j in jobs][0] == "Succ1" and jobs[0].finalMetricData[0].data == {"default": 0.2, "loss": 0.5}
        assert jobs[0].hyperParameters[0].parameters == {"x": 1, "lr": 0.07102170416433433}
        metrics = [TrialMetricData(**m) for m in get_json(srv.api + "/metric-data")]
        assert metrics[0].data == {"default": 2.0, "loss": 1.0}
        results = [TrialResult(**r) for r in get_json(srv.api + "/export-data")]
        assert results[0].value == {"default": 0.2, "loss": 0.5}


def test_url_prefix_and_static_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _mixed(tmp_path / "synth001")
    webui = tmp_path / "static"
    (webui / "static" / "js").mkdir(parents=True)
    (webui / "index.html").write_text("<html>index</html>")
    (webui / "static" / "js" / "main.js").write_text("console.log(1)")
    monkeypatch.setenv("NNI_MANAGER_WEBUI_DIR", str(webui))
    with ServerThread(tmp_path / "synth001", url_prefix="/nni/") as srv:
        assert srv.url.endswith("/nni/")
        assert get_json(srv.api + "/check-status")["status"] == "VIEWED"
        for page in ("", "oview", "detail", "experiment"):
            assert http(srv.url + page)[2] == b"<html>index</html>", page
        status, ctype, body = http(srv.url + "static/js/main.js")
        assert status == 200 and body == b"console.log(1)" and "javascript" in ctype
        root = srv.url.removesuffix("nni/")
        status, _, body = http(root)
        assert status == 404 and body == b'Outside prefix "/nni"'
        assert http(root + "api/v1/nni/check-status")[0] == 404


def test_without_nni_the_page_says_how_and_the_api_stays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _mixed(tmp_path / "synth001")
    monkeypatch.setenv("NNI_MANAGER_WEBUI_DIR", "")
    with ServerThread(tmp_path / "synth001") as srv:
        status, ctype, body = http(srv.url)
        assert status == 200 and ctype.startswith("text/html") and b"pip install nni" in body
        assert len(get_json(srv.api + "/trial-jobs")) == 5


def test_finds_nni_webui_in_the_installed_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from nni_manager.webui.static import webui_dir

    from tests.support.webui.fixtures import nni_installed

    monkeypatch.delenv("NNI_MANAGER_WEBUI_DIR", raising=False)
    found = webui_dir()
    if not nni_installed():
        assert found is None
        return
    import nni

    assert found is not None and (found / "index.html").is_file()
    assert Path(nni.__file__).parent.parent in found.parents  # site-packages/nni_node/static, not a copy
