"""SQLite persistence of one experiment (<experiment_dir>/experiment.db).

Everything a restarted manager needs lives here: the trial table, every metric, the
parameters sent, and per agent the last record seq applied for its current boot, so
replayed records are recognised and each metric takes effect exactly once. Written
from the asyncio thread only; one transaction per received RecordBatch. Commits do not
fsync (WAL, synchronous=NORMAL); WAL checkpoints, which do, run on a thread of their own.
"""
from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypedDict

from nni_manager.jsontypes import JSONValue

from nni_manager.types import (
    HyperParameters,
    TrialJobApplicationForm,
    TrialJobDetail,
    TrialJobStatus,
)

DB_NAME = "experiment.db"


class ExperimentRow(TypedDict, total=False):
    """The experiment's record (`Store.experiment()`; empty before `init_experiment`)."""

    id: str
    # dataclasses.asdict of the ExperimentConfig, secrets redacted; its shape is the config's
    # dataclasses (per platform), which viewers read loosely with `.get`
    config: dict[str, Any]
    start_time: int
    status: str


class MetricRow(TypedDict):
    """One stored metric, as `Store.metrics()` lists it (`data`: NNI's metric JSON, verbatim)."""

    trial_id: str
    type: str
    sequence: int
    data: str
    timestamp: int


class AgentRow(TypedDict):
    """One registered agent (`Store.agents()`); `hints` as `add_agent` stored them."""

    agent_id: str
    name: str
    token: str
    hints: dict[str, JSONValue]
    boot_id: str
    applied_seq: int
    next_cmd_seq: int
    env_id: str | None
    role: str
    idx: int
    enrol: int
    spent: str


class EnvironmentRow(TypedDict):
    """One environment's last saved state (`Store.environments()`)."""

    env_id: str
    trial_id: str | None
    state: str
    reason: str
log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS experiment (
    id TEXT PRIMARY KEY, config TEXT NOT NULL, start_time INTEGER NOT NULL, status TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS trials (
    id TEXT PRIMARY KEY, sequence_id INTEGER NOT NULL, status TEXT NOT NULL, message TEXT NOT NULL,
    submit_time INTEGER NOT NULL, start_time INTEGER, end_time INTEGER, form TEXT NOT NULL,
    agent_id TEXT, gpu_indices TEXT, working_directory TEXT NOT NULL, is_early_stopped INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS trial_events (
    trial_id TEXT NOT NULL, status TEXT NOT NULL, message TEXT NOT NULL, time INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS parameters (
    trial_id TEXT NOT NULL, idx INTEGER NOT NULL, value TEXT NOT NULL, PRIMARY KEY (trial_id, idx)
);
CREATE TABLE IF NOT EXISTS metrics (
    trial_id TEXT NOT NULL, agent_id TEXT NOT NULL, boot_id TEXT NOT NULL, agent_seq INTEGER NOT NULL,
    trial_seq INTEGER NOT NULL, type TEXT NOT NULL, sequence INTEGER NOT NULL, data TEXT NOT NULL,
    timestamp INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS metrics_trial ON metrics (trial_id);
-- the few rows that are not intermediate results (finals): what a viewer loads first; intermediate
-- rows, nearly all of them, skip it on insert
CREATE INDEX IF NOT EXISTS metrics_final ON metrics (trial_id) WHERE type != 'PERIODICAL';
CREATE TABLE IF NOT EXISTS agents (
    agent_id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, token TEXT NOT NULL, hints TEXT NOT NULL,
    boot_id TEXT NOT NULL DEFAULT '', applied_seq INTEGER NOT NULL DEFAULT 0,
    next_cmd_seq INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS environments (
    env_id TEXT PRIMARY KEY, trial_id TEXT, state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
# Columns added after the first release: added to older databases on open.
_ADDED_COLUMNS = {
    "trials": (("environment_id", "TEXT"), ("agents", "TEXT"), ("url", "TEXT")),
    "agents": (("env_id", "TEXT"), ("role", "TEXT NOT NULL DEFAULT ''"), ("idx", "INTEGER NOT NULL DEFAULT 0"),
               ("enrol", "INTEGER NOT NULL DEFAULT 0"), ("spent", "TEXT NOT NULL DEFAULT ''")),
}
_AGENT_COLUMNS = "agent_id, name, token, hints, boot_id, applied_seq, next_cmd_seq, env_id, role, idx, enrol, spent"
_OURS = {"experiment", "trials", "metrics", "agents"}  # tables an experiment database has from its first version


class StoreError(Exception):
    """experiment.db cannot be used: corrupt, not ours, or another experiment's."""


def _refuse(db: Path, why: str) -> StoreError:
    return StoreError(f"{db} is not an nni-manager experiment database ({why}); it was left as it is: move it "
                      "away, or use another experiment id or experimentWorkingDirectory")


class _Checkpointer:
    """WAL checkpoints on a connection and thread of their own. A checkpoint copies the WAL into
    the database and fsyncs both: SQLite's automatic one would do that inside a commit, on the
    event loop, holding it for as long as the disk takes."""

    def __init__(self, db: Path, interval: float = 1.0) -> None:
        self._db, self._interval = db, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn = sqlite3.connect(self._db, isolation_level=None, check_same_thread=False)
        failing = False
        try:
            while not self._stop.wait(self._interval):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    failing = False
                except sqlite3.Error as e:  # e.g. a full disk: the WAL keeps the data; try again later
                    if not failing:
                        log.warning("cannot checkpoint %s now: %s; trying again", self._db, e)
                    failing = True
        finally:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Store:
    """One experiment's database. `open` creates it; `open_readonly` is for the CLI."""

    def __init__(self, conn: sqlite3.Connection, checkpointer: _Checkpointer | None = None) -> None:
        self._conn = conn
        self._in_tx = False
        self._checkpointer = checkpointer

    @classmethod
    def open(cls, experiment_dir: Path) -> Store:
        """Open (creating) the store. The experiment directory is private to its owner: it
        holds agent tokens and the hub's Unix socket."""
        experiment_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(experiment_dir, 0o700)
        db = experiment_dir / DB_NAME
        os.close(os.open(db, os.O_CREAT | os.O_WRONLY, 0o600))
        conn = sqlite3.connect(db, isolation_level=None)
        try:  # before anything writes to it (even journal_mode does)
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            check = conn.execute("PRAGMA quick_check").fetchone()[0] if tables else "ok"
        except sqlite3.DatabaseError as e:
            conn.close()
            raise _refuse(db, str(e)) from None
        if check != "ok":
            conn.close()
            raise _refuse(db, f"damaged: {check}")
        if tables and not _OURS <= tables:
            conn.close()
            shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
            raise _refuse(db, f"it holds other tables: {shown}")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(_SCHEMA)
        for table, columns in _ADDED_COLUMNS.items():
            have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            for name, kind in columns:
                if name not in have:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
        conn.execute("PRAGMA wal_autocheckpoint=0")  # _Checkpointer does it, off the event loop
        return cls(conn, _Checkpointer(db))

    @classmethod
    def open_readonly(cls, experiment_dir: Path) -> Store:
        path = Path(experiment_dir) / DB_NAME
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: is {experiment_dir} an experiment directory?")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        return cls(conn)

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        self._conn.close()  # the last connection to close checkpoints what is left

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group writes; nested use joins the outer transaction."""
        if self._in_tx:
            yield
            return
        self._conn.execute("BEGIN IMMEDIATE")
        self._in_tx = True
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        else:
            try:
                self._conn.execute("COMMIT")
            except BaseException:  # a full disk fails the COMMIT itself: never leave the transaction open
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
        finally:
            self._in_tx = False

    # ------------------------------------------------------------------ experiment
    def init_experiment(self, experiment_id: str, config: Mapping[str, object], start_time: int) -> None:
        row = self._conn.execute("SELECT id FROM experiment").fetchone()
        if row is not None and row[0] != experiment_id:
            db = self._conn.execute("PRAGMA database_list").fetchone()[2]
            raise StoreError(f"{db} belongs to experiment {row[0]}, not {experiment_id}; it was left as it is: "
                             f"resume it with --experiment-id {row[0]}, or use another directory")
        self._conn.execute(
            "INSERT OR IGNORE INTO experiment VALUES (?, ?, ?, 'RUNNING')",
            (experiment_id, json.dumps(config, default=str), start_time),
        )

    def set_experiment_status(self, status: str) -> None:
        self._conn.execute("UPDATE experiment SET status = ?", (status,))

    def experiment(self) -> ExperimentRow:
        row = self._conn.execute("SELECT id, config, start_time, status FROM experiment").fetchone()
        if row is None:
            return ExperimentRow()
        return ExperimentRow(id=row[0], config=json.loads(row[1]), start_time=row[2], status=row[3])

    # ------------------------------------------------------------------ trials
    def save_trial(self, t: TrialJobDetail) -> None:
        self._conn.execute(
            "INSERT OR REPLACE INTO trials (id, sequence_id, status, message, submit_time, start_time, end_time,"
            " form, agent_id, gpu_indices, working_directory, is_early_stopped, environment_id, agents, url)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                t.id, t.sequence_id, t.status.value, t.message, t.submit_time, t.start_time, t.end_time,
                _form_json(t.form), t.agent_id,
                None if t.gpu_indices is None else json.dumps(t.gpu_indices),
                t.working_directory, int(t.is_early_stopped), t.environment_id, json.dumps(t.agents), t.url,
            ),
        )

    def add_event(self, trial_id: str, status: TrialJobStatus, message: str, time_ms: int) -> None:
        self._conn.execute("INSERT INTO trial_events VALUES (?, ?, ?, ?)", (trial_id, status.value, message, time_ms))

    def events(self, trial_id: str) -> list[tuple[str, str, int]]:
        return self._conn.execute(
            "SELECT status, message, time FROM trial_events WHERE trial_id = ? ORDER BY rowid", (trial_id,)
        ).fetchall()

    def trials(self) -> list[TrialJobDetail]:
        rows = self._conn.execute(
            "SELECT id, sequence_id, status, message, submit_time, start_time, end_time, form, agent_id,"
            " gpu_indices, working_directory, is_early_stopped, environment_id, agents, url FROM trials"
            " ORDER BY submit_time, rowid"
        ).fetchall()
        return [_trial_from_row(r) for r in rows]

    def add_parameter(self, trial_id: str, index: int, value: str) -> None:
        self._conn.execute("INSERT OR REPLACE INTO parameters VALUES (?, ?, ?)", (trial_id, index, value))

    def parameters(self, trial_id: str) -> list[tuple[int, str]]:
        return self._conn.execute(
            "SELECT idx, value FROM parameters WHERE trial_id = ? ORDER BY idx", (trial_id,)
        ).fetchall()

    # ------------------------------------------------------------------ metrics
    def add_metric(
        self, trial_id: str, agent_id: str, boot_id: str, agent_seq: int, trial_seq: int, data: str, timestamp: int,
        message: Mapping[str, object] | None = None,
    ) -> None:
        """`message` is `data` already decoded (the ingest check did), saving a parse per metric."""
        kind, sequence = _metric_kind(data) if message is None else _kind_of(message)
        self._conn.execute(
            "INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (trial_id, agent_id, boot_id, agent_seq, trial_seq, kind, sequence, data, timestamp),
        )

    def add_metrics(self, rows: Sequence[tuple[str, str, str, int, int, str, int, Mapping[str, object]]]) -> None:
        """`add_metric` for many at once (one executemany per record batch): (trial_id, agent_id,
        boot_id, agent_seq, trial_seq, data, timestamp, data decoded)."""
        self._conn.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               [(t, a, b, s, n, *_kind_of(m), d, ts) for t, a, b, s, n, d, ts, m in rows])

    def metrics(self, trial_id: str | None = None) -> list[MetricRow]:
        sql = "SELECT trial_id, type, sequence, data, timestamp FROM metrics"
        args: tuple[str, ...] = ()
        if trial_id is not None:
            sql += " WHERE trial_id = ?"
            args = (trial_id,)
        rows = self._conn.execute(sql + " ORDER BY rowid", args).fetchall()
        return [MetricRow(trial_id=t, type=k, sequence=n, data=d, timestamp=ts) for t, k, n, d, ts in rows]

    # ------------------------------------------------------------------ metrics, as viewers read them
    # (the WebUI's model and `export --nni-db`: rows in arrival order, rowid their cursor)
    def data_version(self) -> int:
        """Changes when another connection commits (PRAGMA data_version)."""
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def parameters_since(self, rowid: int) -> sqlite3.Cursor:
        """(rowid, trial_id, idx, value) of parameter records stored after `rowid`."""
        return self._conn.execute(
            "SELECT rowid, trial_id, idx, value FROM parameters WHERE rowid > ? ORDER BY rowid", (rowid,))

    def last_metric_rowid(self) -> int | None:
        return self._conn.execute("SELECT max(rowid) FROM metrics").fetchone()[0]

    def metric_rows_since(self, rowid: int) -> sqlite3.Cursor:
        """(rowid, trial_id, type, data, timestamp) of every metric stored after `rowid`."""
        return self._conn.execute(
            "SELECT rowid, trial_id, type, data, timestamp FROM metrics WHERE rowid > ? ORDER BY rowid", (rowid,))

    def final_rows(self, top: int) -> list[tuple[int, str, str, str, int]]:
        """(rowid, trial_id, type, data, timestamp) of the metrics up to `top` that are not
        PERIODICAL: through `metrics_final` (a store last opened by an older manager lacks it
        until a manager opens it again, and is scanned)."""
        indexed = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'metrics_final'").fetchone()
        return self._conn.execute(
            "SELECT rowid, trial_id, type, data, timestamp FROM metrics"
            f"{' INDEXED BY metrics_final' if indexed else ''} WHERE type != 'PERIODICAL' AND rowid <= ?"
            " ORDER BY rowid", (top,)).fetchall()

    def metric_summary(self, top: int) -> list[tuple[str, int, int, int | None, str | None, int | None]]:
        """Per trial, over the metrics up to `top`: (trial_id, count of all its metrics, its
        newest rowid, and the rowid, data and timestamp of its newest PERIODICAL one or NULLs).
        One pass over the covering `metrics_trial` index plus an index probe per trial, where
        grouping the PERIODICAL rows would read every row."""
        return self._conn.execute(
            "SELECT g.trial_id, g.n, g.top, m.rowid, m.data, m.timestamp FROM"
            " (SELECT trial_id, count(*) AS n, max(rowid) AS top FROM metrics WHERE rowid <= ?1 GROUP BY trial_id) g"
            " LEFT JOIN metrics m ON m.rowid = (SELECT p.rowid FROM metrics p WHERE p.trial_id = g.trial_id"
            " AND p.type = 'PERIODICAL' AND p.rowid <= ?1 ORDER BY p.rowid DESC LIMIT 1)", (top,)).fetchall()

    def metric_rows(self, trial_ids: list[str] | None = None, chunk: int = 500) -> Iterable[tuple[str, str, str, int]]:
        """(trial_id, type, data, timestamp) in arrival order: every metric but REQUEST_PARAMETER,
        streamed, or all those of some trials (`chunk` ids per query: old SQLite builds take at
        most 999 parameters)."""
        sql = "SELECT rowid, trial_id, type, data, timestamp FROM metrics"
        if trial_ids is None:
            return self._conn.execute(
                "SELECT trial_id, type, data, timestamp FROM metrics WHERE type != 'REQUEST_PARAMETER' ORDER BY rowid")
        rows: list[tuple[int, str, str, str, int]] = []
        for i in range(0, len(trial_ids), chunk):
            part = trial_ids[i:i + chunk]
            rows.extend(self._conn.execute(
                sql + f" WHERE trial_id IN ({','.join('?' * len(part))}) ORDER BY rowid", part).fetchall())
        if len(trial_ids) > chunk:
            rows.sort()
        return [r[1:] for r in rows]

    # ------------------------------------------------------------------ agents
    def agent_by_name(self, name: str) -> AgentRow | None:
        row = self._conn.execute(f"SELECT {_AGENT_COLUMNS} FROM agents WHERE name = ?", (name,)).fetchone()
        return None if row is None else _agent_from_row(row)

    def agents(self) -> list[AgentRow]:
        rows = self._conn.execute(f"SELECT {_AGENT_COLUMNS} FROM agents ORDER BY rowid").fetchall()
        return [_agent_from_row(r) for r in rows]

    def add_agent(self, agent_id: str, name: str, token: str, hints: Mapping[str, object], env_id: str | None = None,
                  role: str = "", index: int = 0, enrol: bool = False) -> None:
        self._conn.execute(
            "INSERT INTO agents (agent_id, name, token, hints, env_id, role, idx, enrol) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (agent_id, name, token, json.dumps(hints), env_id, role, index, int(enrol)),
        )

    def set_agent_token(self, agent_id: str, token: str, spent: str) -> None:
        """An agent enrolled: its session token replaces the spent enrolment credential."""
        with self.transaction():
            self._conn.execute("UPDATE agents SET token = ?, enrol = 0, spent = ? WHERE agent_id = ?",
                               (token, spent, agent_id))

    # ------------------------------------------------------------------ environments, settings
    def save_environment(self, env_id: str, trial_id: str | None, state: str, reason: str = "") -> None:
        self._conn.execute("INSERT OR REPLACE INTO environments VALUES (?, ?, ?, ?)", (env_id, trial_id, state, reason))

    def environments(self) -> list[EnvironmentRow]:
        rows = self._conn.execute("SELECT env_id, trial_id, state, reason FROM environments ORDER BY rowid").fetchall()
        return [EnvironmentRow(env_id=e, trial_id=t, state=s, reason=r) for e, t, s, r in rows]

    def setting(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_setting(self, key: str, value: str) -> None:
        self._conn.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", (key, value))

    def set_agent_progress(self, agent_id: str, boot_id: str, applied_seq: int) -> None:
        self._conn.execute(
            "UPDATE agents SET boot_id = ?, applied_seq = ? WHERE agent_id = ?", (boot_id, applied_seq, agent_id)
        )

    def set_next_cmd_seq(self, agent_id: str, next_cmd_seq: int) -> None:
        self._conn.execute("UPDATE agents SET next_cmd_seq = ? WHERE agent_id = ?", (next_cmd_seq, agent_id))


def _form_json(form: TrialJobApplicationForm) -> str:
    """json.dumps(asdict(form)), without asdict's recursive deep copy: a trial's row is
    written at each of its changes (4 times for a trial that simply runs)."""
    fields = dict(form.__dict__)
    fields["hyper_parameters"] = dict(form.hyper_parameters.__dict__)
    return json.dumps(fields)


def _metric_kind(data: str) -> tuple[str, int]:
    """(type, sequence) of an NNI metric JSON; unparsable data is kept as CUSTOM."""
    try:
        return _kind_of(json.loads(data))
    except (ValueError, TypeError):
        return "CUSTOM", 0


def _kind_of(obj: object) -> tuple[str, int]:
    if not isinstance(obj, Mapping):
        return "CUSTOM", 0
    sequence = obj.get("sequence", 0) or 0
    try:
        if not isinstance(sequence, (int, float, str)):
            raise TypeError(sequence)
        return str(obj.get("type", "CUSTOM")), int(sequence)
    except (ValueError, TypeError):
        return "CUSTOM", 0


def _trial_from_row(r: tuple[Any, ...]) -> TrialJobDetail:  # a sqlite3 row: its cells' types are the schema's
    form = json.loads(r[7])
    hp = form.pop("hyper_parameters")
    return TrialJobDetail(
        id=r[0], sequence_id=r[1], status=TrialJobStatus(r[2]), message=r[3], submit_time=r[4],
        start_time=r[5], end_time=r[6],
        form=TrialJobApplicationForm(hyper_parameters=HyperParameters(**hp), **form),
        agent_id=r[8], gpu_indices=None if r[9] is None else json.loads(r[9]),
        working_directory=r[10], is_early_stopped=bool(r[11]), environment_id=r[12],
        agents=json.loads(r[13]) if r[13] else ([r[8]] if r[8] else []), url=r[14],
    )


def _agent_from_row(r: tuple[Any, ...]) -> AgentRow:  # a sqlite3 row, in _AGENT_COLUMNS' order
    agent_id, name, token, hints, boot_id, applied_seq, next_cmd_seq, env_id, role, idx, enrol, spent = r
    return AgentRow(agent_id=agent_id, name=name, token=token, hints=json.loads(hints), boot_id=boot_id,
                    applied_seq=applied_seq, next_cmd_seq=next_cmd_seq, env_id=env_id, role=role, idx=idx,
                    enrol=enrol, spent=spent)
