"""What a trial finds on its path: the worker's own, plus NNI's trial API, never the agent's path.

The boot step puts the agent's wheel and its shipped dependencies on the agent's sys.path only
(boot.py BOOTSTRAP records them in BOOT_PATHS). Trials inherit the worker's PYTHONPATH unchanged,
so their imports of protobuf, grpc or psutil get the image's versions. Trial code that uses
`import nni_agent as nni` without NNI installed still finds the stdlib-only trial API: where the
agent came from a private path, a directory holding only `nni_agent/__init__.py` and
`trial_api.py` (and an Optuna study's runner) goes first on the trial's PYTHONPATH.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

BOOT_PATHS: list[str] = []  # the agent's private paths, set by boot.py's BOOTSTRAP (empty: none)
# what `import nni_agent` needs (stdlib only), and the runner of an Optuna study's trials
# (`python -m nni_agent.study_runner`: it imports the trial's own grpc, which optuna's proxy needs anyway)
_TRIAL_API_FILES = ("__init__.py", "trial_api.py", "study_runner.py", "study_storage.py")
_made: list[str] = []


def trial_api_dir(work_dir: Path) -> str | None:
    """A directory with only the trial API in it (made once under `work_dir`), where the agent runs
    from private paths; None where the worker's Python has the agent itself."""
    if not BOOT_PATHS:
        return None
    if _made:
        return _made[0]
    here = Path(__file__).resolve().parent
    work_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".trial-api-", dir=work_dir))
    (tmp / "nni_agent").mkdir()
    for name in _TRIAL_API_FILES:
        shutil.copyfile(here / name, tmp / "nni_agent" / name)
    _made.append(str(tmp))
    return str(tmp)


def trial_pythonpath(work_dir: Path, inherited: str | None) -> str | None:
    """The trial's PYTHONPATH: the worker's own, after the trial API directory where there is one."""
    api = trial_api_dir(work_dir)
    if api is None:
        return inherited
    return os.pathsep.join([api] + ([inherited] if inherited else []))
