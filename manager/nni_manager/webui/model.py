"""What the WebUI polls, kept current without replaying the store.

An open browser asks every 10 s for every trial and, past 100 trials, for each trial's
final and latest intermediate result plus 20-trial chunks of all metrics. So:

* trials come from memory: the running manager's trial table, or (viewing a stored
  experiment) the store's `trials` table, re-read only when another connection committed;
* finals, the latest intermediate result and the count of intermediate results per trial are
  kept in memory and extended by reading only metric rows past the last rowid seen;
* whole metric lists are one indexed query (`metrics_trial`) per request, written as JSON row by
  row without building the records (a full dump is a million rows).

The SQL is the store's (`Store`'s viewer methods); this module keeps the aggregates.

All SQLite work runs on one thread of its own with a read-only connection (WAL lets it read
while the manager writes), so a large `/metric-data` never stalls the experiment's event loop.
PERIODICAL sequences are numbered 0..n-1 per trial in arrival order, as NNI's are, whatever
the trial reported: the WebUI indexes intermediate results by sequence.
"""
from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from nni_manager.metrics import Sequences, metric_message, numbered
from nni_manager.store import DB_NAME, Store
from nni_manager.types import TrialJobDetail
from nni_manager.webui.views import MetricRecord, metric_record, metric_record_json

LiveTrials = Callable[[], Iterable[TrialJobDetail]]  # the running manager's trial table

T = TypeVar("T")
_WHERE = "the WebUI"  # who skips a malformed row, in its warning
_CHUNK = 500  # SQLite's host-parameter limit is 999 on old builds


class DataModel:
    """The experiment's trials and metrics as the REST API needs them.

    `live_trials` returns the running manager's trials (in submission order); without it the
    trials are read from the store (a finished or copied experiment).
    """

    def __init__(self, experiment_dir: Path,
                 live_trials: LiveTrials | None = None) -> None:
        self.experiment_dir = experiment_dir
        self._db = experiment_dir / DB_NAME
        self._live_trials = live_trials
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="webui-db")
        self._conn: sqlite3.Connection | None = None
        self._metric_rowid = 0
        self._parameter_rowid = 0
        self._data_version: int | None = None
        self._stored: list[TrialJobDetail] = []
        self.finals: dict[str, list[MetricRecord]] = {}  # non-PERIODICAL records, arrival order
        self.final_json: dict[str, str] = {}  # trial -> `final()` as JSON, for the trial table
        self.latest: dict[str, MetricRecord] = {}  # the latest PERIODICAL record
        self._sequences = Sequences()  # numbers PERIODICAL records as they arrive
        self.periodical = self._sequences.periodical  # trial -> how many PERIODICAL records
        self.last_rowid: dict[str, int] = {}  # trial -> rowid of its newest metric (ETags of ranges)
        self.parameters: dict[str, dict[int, str]] = {}  # trial -> parameter index -> record JSON
        self._refreshing: asyncio.Future[None] | None = None
        self._summary: asyncio.Future[None] | None = None  # the summary's loading, until awaited
        self._summary_top: int | None = None  # the first load's last rowid, until its summary is loaded
        self._others: dict[str, int] = {}  # meanwhile: trial -> its metrics that are not PERIODICAL

    def close(self) -> None:
        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        self._pool.submit(shut)
        self._pool.shutdown(wait=True)

    # ------------------------------------------------------------------ reading
    def trials(self) -> list[TrialJobDetail]:
        """Every trial, in submission order (NNI's first-event order)."""
        if self._live_trials is not None:
            return list(self._live_trials())
        return list(self._stored)

    def final(self, trial_id: str) -> MetricRecord | None:
        for record in self.finals.get(trial_id, ()):
            if record["type"] == "FINAL":
                return record
        return None

    def latest_records(self) -> list[MetricRecord]:
        """`/metric-data-latest`: per trial, its non-PERIODICAL records, then its latest
        PERIODICAL one."""
        out: list[MetricRecord] = []
        for t in self.trials():
            out.extend(self.finals.get(t.id, ()))
            latest = self.latest.get(t.id)
            if latest is not None:
                out.append(latest)
        return out

    async def refresh(self, finals_only: bool = False) -> None:
        """Take in what the store gained since the last call; concurrent callers share one.
        `finals_only`: the caller reads trials, parameters and finals only (the trial table),
        so need not wait for the first load's per-trial summary."""
        if not self._db.exists():  # the manager has not opened the experiment yet
            return
        if self._refreshing is not None:
            await asyncio.shield(self._refreshing)
        else:
            loop = asyncio.get_running_loop()
            self._refreshing = loop.create_future()
            try:
                await self._run(self._refresh)
                if self._summary_top is not None:
                    # queued on the DB thread: every later call runs after it
                    self._summary = asyncio.wrap_future(self._pool.submit(self._with_conn, self._load_summary))
            finally:
                done, self._refreshing = self._refreshing, None
                done.set_result(None)
        if not finals_only and self._summary is not None:
            await asyncio.shield(self._summary)
            self._summary = None

    async def metrics_json(self, trial_ids: list[str] | None = None, kind: str | None = None) -> str:
        """A JSON array of MetricDataRecords, in arrival order: all of them, or those of some
        trials, optionally of one type. Serialised off the event loop."""
        if not self._db.exists():
            return "[]"
        return await self._run(lambda conn: self._query_metrics(conn, trial_ids, kind))

    # ------------------------------------------------------------------ the DB thread
    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._with_conn, fn)

    def _with_conn(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            self._conn = sqlite3.connect(f"file:{self._db}?mode=ro", uri=True, isolation_level=None)
        return fn(self._conn)

    def _refresh(self, conn: sqlite3.Connection) -> None:
        store = Store(conn)
        if self._live_trials is None:
            version = store.data_version()
            if version != self._data_version:
                self._data_version = version
                self._stored = store.trials()
        for rowid, trial_id, idx, value in store.parameters_since(self._parameter_rowid):
            self.parameters.setdefault(trial_id, {})[idx] = value
            self._parameter_rowid = rowid
        if self._metric_rowid == 0:
            self._first_load(store)
            return
        for rowid, trial_id, kind, data, timestamp in store.metric_rows_since(self._metric_rowid):
            self._metric_rowid = rowid
            self._take(trial_id, kind, data, timestamp, rowid)

    def _take(self, trial_id: str, kind: str, data: str, timestamp: int, rowid: int) -> None:
        self.last_rowid[trial_id] = max(rowid, self.last_rowid.get(trial_id, 0))
        if kind == "REQUEST_PARAMETER":
            return
        message = metric_message(data, _WHERE, trial_id)
        if message is None:
            return
        sequence = self._sequences.number(trial_id, kind, message)
        record = metric_record(trial_id, message, timestamp, sequence)
        if kind == "PERIODICAL":
            self.latest[trial_id] = record
        else:
            self.finals.setdefault(trial_id, []).append(record)
            if record["type"] == "FINAL" and trial_id not in self.final_json:
                self.final_json[trial_id] = metric_record_json(trial_id, message, timestamp, sequence)

    def _first_load(self, store: Store) -> None:
        """Aggregates instead of every row, in two steps: the finals through their own index
        now, the per-trial summary (`_load_summary`) right after."""
        top = store.last_metric_rowid()
        if top is None:
            return
        for rowid, trial_id, kind, data, timestamp in store.final_rows(top):
            self._others[trial_id] = self._others.get(trial_id, 0) + 1
            self._take(trial_id, kind, data, timestamp, rowid)
        self._metric_rowid = self._summary_top = top

    def _load_summary(self, conn: sqlite3.Connection) -> None:
        """The latest PERIODICAL record, the count of them and the newest rowid of every trial,
        up to the first load's last row (later rows are `_take`n on top, after this)."""
        top, self._summary_top = self._summary_top, None
        if top is None:
            return
        for trial_id, count, newest, rowid, data, timestamp in Store(conn).metric_summary(top):
            self.last_rowid[trial_id] = max(newest, self.last_rowid.get(trial_id, 0))
            if rowid is None or data is None or timestamp is None:  # no PERIODICAL row (columns are NOT NULL)
                continue
            message = metric_message(data, _WHERE, trial_id)
            if message is not None:
                periodical = count - self._others.get(trial_id, 0)
                self.periodical[trial_id] = periodical
                self.latest[trial_id] = metric_record(trial_id, message, timestamp, periodical - 1)
        self._others.clear()

    def _query_metrics(self, conn: sqlite3.Connection, trial_ids: list[str] | None,
                       kind: str | None) -> str:
        """The JSON array itself, each record written directly (`metric_record_json`): the whole
        dump of 10,000 trials x 101 results is a million rows, and per-row Python is its cost."""
        out: list[str] = []
        append = out.append
        for trial_id, row_kind, message, timestamp, sequence in numbered(Store(conn).metric_rows(trial_ids, _CHUNK),
                                                                          _WHERE):
            if kind is None or row_kind == kind:
                append(metric_record_json(trial_id, message, timestamp, sequence))
        return "[" + ",".join(out) + "]"
