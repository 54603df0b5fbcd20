"""`nni-manager export --nni-db`: NNI 3.0's db/nni.sqlite from our store, opened by NNI's own tools
(`nnictl view`, which runs NNI's Node.js manager from the nni wheel, its REST API,
`Experiment.connect()`, `nnictl trial ls`, `nnictl experiment export`)."""
from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from nni_manager.types import TrialJobStatus as S
from nni_manager.webui import manifest
from nni_manager.webui.nni_db import INDEXES, TABLES, export_nni_db

from tests.support.webui.fixtures import CLI, CONFIG, ServerThread, Synthetic, get_json, needs_nni
from tests.support.webui.nni_view import NniView, node_why_not

NON_ASCII = "exit code 3: ünïcödé 失败"


def build(directory: Path) -> Synthetic:
    s = Synthetic(directory)
    s.trial("aaaaa", S.SUCCEEDED, {"x": 1, "lr": 0.01}, intermediates=[{"default": 0.1, "loss": 1.0}, 0.2],
            final={"default": 0.5, "loss": 0.1})
    s.trial("bbbbb", S.FAILED, {"x": 2, "lr": 0.02}, message=NON_ASCII, intermediates=[float("nan")])
    s.trial("ccccc", S.SUCCEEDED, {"x": 3, "lr": 0.03}, intermediates=[1, 2, 3], sequences=[0, 5, 9], final=3.0)
    s.trial("ddddd", S.EARLY_STOPPED, {"x": 1, "lr": 0.04}, intermediates=[0.5])
    s.trial("eeeee", S.RUNNING, {"x": 2, "lr": 0.05}, intermediates=[7])
    s.trial("fffff", S.WAITING, {"x": 3, "lr": 0.06}, message="waiting for a GPU")
    s.add_metric("aaaaa", "REQUEST_PARAMETER", 0, "")
    s.logs("aaaaa", b"stdout of aaaaa\n", b"")
    s.logs("bbbbb", b"", b"Traceback: boom\n")
    return s


def _statements(sql: str) -> list[str]:
    return sorted(re.sub(r"\s+", " ", st).strip().lower() for st in sql.split(";") if st.strip())


def test_schema_rows_and_layout(tmp_path: Path, home: Path) -> None:
    exp = tmp_path / "exps" / "synth001"
    build(exp).store.close()
    done = export_nni_db(exp)
    assert done.directory == exp and done.db == exp / "db" / "nni.sqlite"
    assert (done.trials, done.metrics) == (6, 10)  # REQUEST_PARAMETER left out
    db = sqlite3.connect(done.db)
    schema = [row[0] for row in db.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL")]
    assert _statements(";".join(schema)) == _statements(TABLES + INDEXES)

    (params, exp_id, duration, start, end, log_dir, next_seq, revision), = db.execute("select * from ExperimentProfile")
    params = json.loads(params)
    assert (exp_id, start, log_dir, next_seq, revision) == ("synth001", 1_795_000_000_000, str(exp), 6, 1)
    assert end >= start and duration == (end - start) // 1000
    assert params["experimentWorkingDirectory"] == str(exp.parent)
    assert params["searchSpace"] == CONFIG["search_space"] and params["trainingService"]["platform"] == "local"
    assert params["trialCodeDirectory"] == str(exp)  # /code does not exist here; NNI validates it
    assert "gpuIndices" not in params["trainingService"]

    events = db.execute("select * from TrialJobEvent order by rowid").fetchall()
    by_trial: dict[str, list[tuple[Any, ...]]] = {}
    for row in events:
        by_trial.setdefault(row[1], []).append(row)
    assert [r[2] for r in by_trial["aaaaa"]] == ["WAITING", "RUNNING", "SUCCEEDED"]
    assert [r[2] for r in by_trial["eeeee"]] == ["WAITING", "RUNNING"]
    assert [r[2] for r in by_trial["fffff"]] == ["WAITING"]
    assert [r[0] for r in events] == sorted(r[0] for r in events)  # appended in time order, as NNI does
    first = by_trial["bbbbb"][0]
    assert json.loads(first[3]) == {"parameter_id": 1, "parameter_source": "algorithm",
                                    "parameters": {"x": 2, "lr": 0.02}, "parameter_index": 0}
    assert [r[3] for r in by_trial["bbbbb"][1:]] == [None, None]  # the record on the first row only
    assert by_trial["bbbbb"][-1][6] == NON_ASCII and by_trial["bbbbb"][0][6] is None
    assert {r[4] for r in by_trial["bbbbb"]} == {str(exp / "environments" / "local-env" / "trials" / "bbbbb")}
    assert {(r[5], r[7]) for r in by_trial["bbbbb"]} == {(1, "local-env")}

    metrics = db.execute("select * from MetricData order by rowid").fetchall()
    assert all(isinstance(m[2], str) for m in metrics)  # parameterId as text
    assert [m[4] for m in metrics if m[1] == "ccccc" and m[3] == "PERIODICAL"] == [0, 1, 2]  # dense
    final = next(m for m in metrics if m[1] == "aaaaa" and m[3] == "FINAL")
    assert json.loads(json.loads(final[5])) == {"default": 0.5, "loss": 0.1}  # JSON.stringify(value string)
    assert json.loads(next(m for m in metrics if m[1] == "bbbbb")[5]) == "NaN"
    assert not any(m[3] == "REQUEST_PARAMETER" for m in metrics)
    db.close()

    trial_dir = exp / "environments" / "local-env" / "trials"
    assert (trial_dir / "aaaaa" / "trial.stdout").is_symlink()  # in place: relative links
    assert (trial_dir / "aaaaa" / "trial.log").read_bytes() == b"stdout of aaaaa\n"  # no SDK log: the stdout
    assert (trial_dir / "bbbbb" / "trial.stderr").read_bytes() == b"Traceback: boom\n"
    assert (exp / "log").is_dir()
    entry = manifest.read(home / "nni-experiments" / ".experiment")["synth001"]
    assert entry["status"] == "STOPPED" and entry["logDir"] == str(exp.parent) and "port" not in entry
    assert entry["tag"] == [] and entry["experimentName"] == CONFIG["experiment_name"]

    again = export_nni_db(exp)  # idempotent: the DB is replaced, not appended to
    assert sqlite3.connect(again.db).execute("select count(*) from ExperimentProfile").fetchone() == (1,)


def test_cli_export_elsewhere_and_running_manager(tmp_path: Path, home: Path) -> None:
    exp = tmp_path / "exps" / "synth001"
    build(exp).store.close()
    out = tmp_path / "for-nni"
    done = subprocess.run([*CLI, "export", "--nni-db", str(exp), "--out", str(out), "--no-register"],
                          env={**os.environ, "HOME": str(home)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done
    assert f"nnictl view synth001 --experiment_dir {out}" in done.stdout and "6 trials, 10 metrics" in done.stdout
    assert not (home / "nni-experiments" / ".experiment").exists()
    copied = out / "synth001" / "environments" / "local-env" / "trials" / "aaaaa" / "trial.stdout"
    assert not copied.is_symlink() and copied.read_bytes() == b"stdout of aaaaa\n"  # a standalone copy
    profile = json.loads(sqlite3.connect(out / "synth001" / "db" / "nni.sqlite")
                         .execute("select params, logDir from ExperimentProfile").fetchone()[0])
    assert profile["experimentWorkingDirectory"] == str(out)

    # a manager still serving the experiment keeps its manifest entry
    manifest.register({"id": "synth001", "status": "RUNNING", "pid": os.getpid(), "port": 1234, "logDir": "x"})
    result = export_nni_db(exp)
    assert not result.registered and "still served" in result.notes[-1]
    assert manifest.read()["synth001"]["port"] == 1234

    missing = subprocess.run([*CLI, "export", "--nni-db", str(tmp_path)], env={**os.environ, "HOME": str(home)},
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "holds no experiment" in missing.stderr


@needs_nni
def test_schema_is_nni_3_0s_own(tmp_path: Path) -> None:
    """The tables and indexes are the statements of the installed NNI's sqlDatabase.js."""
    import nni_node

    source = (Path(nni_node.__path__[0]) / "core" / "sqlDatabase.js").read_text()
    create = re.search(r"const createTables = `(.*?)`;", source, re.S)
    assert create is not None
    assert _statements(create.group(1)) == _statements(TABLES + INDEXES)


def _strip(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Trials without what differs by design: where the logs are, and NNI 3.0's envId."""
    return [{k: v for k, v in j.items() if k not in ("logPath", "stderrPath", "envId")} for j in jobs]


@pytest.mark.slow
@needs_nni
def test_nnictl_view_serves_the_export(tmp_path: Path, home: Path) -> None:
    why = node_why_not()
    if why:
        pytest.skip(why)
    exp = tmp_path / "exps" / "synth001"
    build(exp).store.close()
    export_nni_db(exp)
    from nni.experiment.launcher import get_stopped_experiment_config

    config = get_stopped_experiment_config("synth001", str(exp.parent))  # NNI's own reader + validation
    assert config.experiment_name == CONFIG["experiment_name"] and config.max_trial_number == 200

    view = NniView(home, "synth001", exp.parent)
    try:
        node = psutil.Process(view.pid)
        listening = {c.laddr.ip for c in node.net_connections() if c.status == psutil.CONN_LISTEN}
        assert listening == {"127.0.0.1"}, listening
        assert view.get("/check-status") == {"status": "VIEWED", "errors": []}
        assert view.entry()["status"] == "VIEWED" and view.entry()["port"] == view.port
        theirs = view.get("/trial-jobs")
        with ServerThread(exp) as ours:
            for path in ("/metric-data", "/metric-data-latest/", "/metric-data-range/0/2", "/export-data",
                         "/job-statistics", "/metric-data/ccccc", "/metric-data?type=FINAL"):
                mine, nni = get_json(ours.api + path), view.get(path)
                if path.startswith("/metric-data-latest"):  # same records; NNI puts finals first
                    key = json.dumps
                    mine, nni = sorted(mine, key=key), sorted(nni, key=key)
                assert mine == nni, path
            assert _strip(get_json(ours.api + "/trial-jobs")) == _strip(theirs)
            assert get_json(ours.api + "/experiment")["params"]["searchSpace"] == \
                view.get("/experiment")["params"]["searchSpace"]
        assert [j["status"] for j in theirs] == ["SUCCEEDED", "FAILED", "SUCCEEDED", "EARLY_STOPPED", "RUNNING",
                                                 "WAITING"]
        assert theirs[1]["message"] == NON_ASCII and theirs[5]["message"] == "waiting for a GPU"
        with __import__("urllib.request").request.urlopen(view.api + "/trial-file/aaaaa/stdout") as r:
            assert r.read() == b"stdout of aaaaa\n"
        with __import__("urllib.request").request.urlopen(view.api + "/trial-file/bbbbb/stderr") as r:
            assert r.read() == b"Traceback: boom\n"

        from nni.experiment import Experiment

        client = Experiment.connect(view.port)
        assert client.id == "synth001" and client.get_status() == "VIEWED"
        jobs = client.list_trial_jobs()
        assert [j.hyperParameters[0].parameters["lr"] for j in jobs] == [0.01, 0.02, 0.03, 0.04, 0.05, 0.06]
        assert jobs[0].finalMetricData[0].data == {"default": 0.5, "loss": 0.1}
        assert sorted(str(r.value) for r in client.export_data()) == ["3.0", "{'default': 0.5, 'loss': 0.1}"]
        metrics = client.get_job_metrics()
        assert [m.sequence for m in metrics["ccccc"] if m.type == "PERIODICAL"] == [0, 1, 2]

        listed = view.nnictl("trial", "ls", "synth001")
        assert listed.returncode == 0 and len(re.findall(r'"status": ?"', listed.stdout)) == 6, listed
        out = tmp_path / "export.json"
        exported = view.nnictl("experiment", "export", "synth001", "--filename", str(out), "--type", "json")
        assert exported.returncode == 0, exported
        assert sorted(e["trialJobId"] for e in json.loads(out.read_text())) == ["aaaaa", "ccccc"]
        shown = view.nnictl("config", "show", "synth001")  # reads db/nni.sqlite itself
        assert shown.returncode == 0 and "loguniform" in shown.stdout, shown
    finally:
        pid = view.pid
        view.close()
    assert view.stopped.returncode == 0, view.stopped
    assert pid is not None
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # gone


def test_trials_nni_ran_into_the_db_are_kept_not_replaced(tmp_path: Path, home: Path) -> None:
    """`nnictl resume ID` runs NNI's own manager on the db we wrote; the trials it runs exist only
    there, so writing the db again (at the next stop, or export) moves it aside instead."""
    exp = tmp_path / "exps" / "synth001"
    build(exp).store.close()
    first = export_nni_db(exp, register=False)
    assert first.kept is None
    again = export_nni_db(exp, register=False)  # our own rows only: simply replaced
    assert again.kept is None and sorted(p.name for p in first.db.parent.iterdir()) == ["nni.sqlite"]
    db = sqlite3.connect(first.db)  # what NNI's manager appends for a trial it submits
    db.execute("insert into TrialJobEvent values (?,?,?,?,?,?,?,?)",
               (1_795_000_100_000, "nniT1", "WAITING", '{"parameter_id": 6}', "", 6, None, "local-env"))
    db.commit()
    db.close()
    done = subprocess.run([*CLI, "export", "--nni-db", str(exp), "--no-register"],
                          env={**os.environ, "HOME": str(home)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (kept,) = [p for p in first.db.parent.iterdir() if p.name != "nni.sqlite"]
    assert f"kept as {kept}" in done.stderr
    assert sqlite3.connect(kept).execute("select trialJobId from TrialJobEvent where trialJobId='nniT1'").fetchone()
    fresh = sqlite3.connect(first.db)
    assert fresh.execute("select count(*) from TrialJobEvent where trialJobId='nniT1'").fetchone() == (0,)
    fresh.close()
