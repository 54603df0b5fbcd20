"""Terminal view of an experiment: a rich Live table on a TTY, plain lines otherwise."""
from __future__ import annotations

import os
import shlex
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from nni_manager.experiment import Experiment, ExperimentResult, TrialSummary
from nni_manager.types import TrialJobStatus

_STYLE = {
    TrialJobStatus.WAITING: "yellow",
    TrialJobStatus.RUNNING: "cyan",
    TrialJobStatus.SUCCEEDED: "green",
    TrialJobStatus.FAILED: "red",
    TrialJobStatus.SYS_CANCELED: "red",
    TrialJobStatus.USER_CANCELED: "magenta",
    TrialJobStatus.EARLY_STOPPED: "magenta",
}


def fmt_value(value: object) -> str:
    """Compact numbers (4 significant digits) and nested choices (`sgd(lr=0.01)`)."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        if "_name" in value:
            inner = fmt_params({k: v for k, v in value.items() if k != "_name"})
            return f"{value['_name']}({inner})" if inner else str(value["_name"])
        if "default" in value:
            return fmt_value(value["default"])
        return fmt_params(value)
    return str(value)


def fmt_params(params: dict[str, object] | None) -> str:
    return ", ".join(f"{k}={fmt_value(v)}" for k, v in (params or {}).items())


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}" if minutes else f"{seconds:.1f}s"


def trial_table(trials: Iterable[TrialSummary], best: TrialSummary | None = None) -> Table:
    table = Table(expand=False, header_style="bold")
    for name, justify in (("trial", "left"), ("#", "right"), ("status", "left"), ("parameters", "left"),
                          ("latest", "right"), ("final", "right"), ("GPUs", "left"), ("elapsed", "right"),
                          ("message", "left")):
        wraps = name in ("parameters", "GPUs", "message")  # the others stay on one line
        table.add_column(name, justify=justify, overflow="fold", no_wrap=not wraps)  # type: ignore[arg-type]
    now_ms = int(time.time() * 1000)
    for t in trials:
        marker = " *" if best is not None and t.trial_id == best.trial_id else ""
        gpus = "-" if not t.gpu_indices else ",".join(map(str, t.gpu_indices))
        table.add_row(
            t.trial_id + marker, str(t.sequence_id), Text(t.status.value, style=_STYLE.get(t.status, "")),
            fmt_params(t.parameters), "-" if t.latest is None else fmt_value(t.latest),
            "-" if t.final is None else fmt_value(t.final), gpus, fmt_seconds(t.elapsed(now_ms)), t.message,
        )
    return table


def status_line(trials: Iterable[TrialSummary], experiment_dir: Path | None) -> str:
    counts = Counter(t.status.value for t in trials)
    parts = [f"{n} {s.lower()}" for s, n in sorted(counts.items())] or ["no trials yet"]
    return f"{', '.join(parts)}  |  {experiment_dir or 'starting...'}"


def final_summary(result: ExperimentResult) -> str:
    lines = [f"Experiment {result.experiment_id} stopped: {result.stop_reason or 'done'}."]
    counts = Counter(t.status.value for t in result.trials)
    lines.append(f"Trials: {len(result.trials)} ({', '.join(f'{n} {s.lower()}' for s, n in sorted(counts.items()))})"
                 if result.trials else "Trials: none")
    best = result.best
    if best is None:
        lines.append("Best trial: none reported a final metric.")
    else:
        lines.append(f"Best trial ({result.optimize_mode}): {best.trial_id}  metric {fmt_value(best.final)}  "
                     f"parameters {fmt_params(best.parameters)}")
    cmd = command_name()
    lines.append(f"Results: {result.experiment_dir}  "
                 f"({cmd} trials {result.experiment_dir}; {cmd} logs {result.experiment_dir} TRIAL_ID)")
    return "\n".join(lines)


def command_name() -> str:
    """How to call nni-manager from a new shell: its full path when it lives in a virtual
    environment that is not activated (the quickstart's .venv), else the plain name."""
    script = Path(sys.executable).parent / "nni-manager"
    if sys.prefix != sys.base_prefix and not os.environ.get("VIRTUAL_ENV") and script.is_file():
        return shlex.quote(str(script))
    return "nni-manager"


class ExperimentView:
    """Shows an Experiment while it runs. Use as a context manager and pass `event`
    as the experiment's `on_event`."""

    def __init__(self, experiment: Experiment, *, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.experiment = experiment
        self.stream = stream or sys.stdout
        self.console = Console(file=self.stream)
        self.live = self.console.is_terminal if live is None else live
        self._live: Live | None = None
        self._announced = False

    def __enter__(self) -> ExperimentView:
        if self.live:
            self._live = Live(get_renderable=self._render, console=self.console, refresh_per_second=4)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def _render(self) -> Group:
        trials = sorted(self.experiment.trials.values(), key=lambda t: t.sequence_id)
        return Group(trial_table(trials), Text(status_line(trials, self.experiment.experiment_dir), style="dim"))

    def event(self, kind: str, trial: TrialSummary) -> None:
        if self.live or kind == "intermediate":
            return
        if not self._announced:
            self._announced = True
            print(f"experiment {self.experiment.experiment_id}: {self.experiment.experiment_dir}",
                  file=self.stream, flush=True)
        stamp = time.strftime("%H:%M:%S")
        if kind == "submitted":
            text = f"submitted  #{trial.sequence_id}  {fmt_params(trial.parameters)}"
        elif kind == "final":
            text = f"final      {fmt_value(trial.final)}"
        else:
            text = f"{trial.status.value:<10} {trial.message}".rstrip()
            if trial.status.is_terminal:
                text += f"  ({fmt_seconds(trial.elapsed())})"
        print(f"[{stamp}] trial {trial.trial_id}  {text}", file=self.stream, flush=True)
