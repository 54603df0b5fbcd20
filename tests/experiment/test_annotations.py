"""`useAnnotation: true`: the search space from the trial code's NNI annotations, a real run of an
expanded copy (with the real nni SDK in the trials), and the user's directory left as it was."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from nni_manager import annotations
from nni_manager.config import ConfigError
from nni_manager.loader import load_config
from nni_manager.experiment import Experiment
from nni_manager.types import TrialJobStatus


def _need_nni() -> None:
    """Found, not imported: importing `nni` in the test process costs seconds (scipy, pandas)."""
    if importlib.util.find_spec("nni") is None:
        pytest.skip("the real nni package is not installed; pip install nni==3.0")

ANNOTATED = '''
    """An NNI annotated trial: a plain script until nni expands it."""
    import sys


    def train(width, rate):
        return width * 10 + rate


    def main():
        """@nni.get_next_parameter()"""
        """@nni.variable(nni.choice(1, 2, 3), name=width)"""
        width = 1
        """@nni.variable(nni.choice(0.5, 0.25), name=rate)"""
        rate = 0.5
        for step in range(2):
            """@nni.report_intermediate_result(step)"""
        metric = train(width, rate)
        print("trial width", width, "rate", rate, file=sys.stderr)
        """@nni.report_final_result(metric)"""


    main()
'''


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(root.rglob("*"))}


@pytest.fixture
def annotated(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    (code / "helpers").mkdir(parents=True)
    (code / "trial.py").write_text(textwrap.dedent(ANNOTATED))
    (code / "helpers" / "__init__.py").write_text("SCALE = 10  # no annotation: copied as it is\n")
    (code / "notes.txt").write_text("not code\n")
    for path in (code / "trial.py", code / "notes.txt"):
        path.chmod(0o444)  # a read-only checkout: its copies are replaced all the same
    return code


def _config(tmp_path: Path, **overrides: Any) -> Path:
    config: dict[str, Any] = {
        "trialCommand": f"{sys.executable} trial.py",
        "trialCodeDirectory": "code",
        "trialConcurrency": 2,
        "maxTrialNumber": 6,
        "useAnnotation": True,
        "tuner": {"name": "GridSearch"},
        "trainingService": {"platform": "local"},
        "experimentWorkingDirectory": "exps",
    }
    config.update(overrides)
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_search_space_comes_from_the_annotations(annotated: Path, tmp_path: Path) -> None:
    before = _snapshot(annotated)
    config = load_config(_config(tmp_path))
    assert config.search_space == {"trial/width/choice": {"_type": "choice", "_value": [1, 2, 3]},
                                   "trial/rate/choice": {"_type": "choice", "_value": [0.5, 0.25]}}
    assert config.use_annotation and config.trial_code_directory == annotated
    assert _snapshot(annotated) == before and not (tmp_path / "exps").exists()


def test_a_run_expands_a_copy_and_the_trials_get_the_annotated_values(annotated: Path, tmp_path: Path) -> None:
    _need_nni()  # the expanded code imports the real SDK, as NNI's did
    before = _snapshot(annotated)
    config = load_config(_config(tmp_path, maxTrialNumber=4))
    result = asyncio.run(Experiment(config, poll_interval=0.2).run())

    assert [t.status for t in result.trials] == [TrialJobStatus.SUCCEEDED] * 4, [t.message for t in result.trials]
    drawn = [(t.parameters["trial/width/choice"], t.parameters["trial/rate/choice"]) for t in result.trials]
    assert len(set(drawn)) == 4 and all(w in (1, 2, 3) and r in (0.5, 0.25) for w, r in drawn)
    for trial, (width, rate) in zip(result.trials, drawn):
        assert trial.final == width * 10 + rate and trial.intermediate_count == 2
    expanded = result.experiment_dir / annotations.EXPANDED_DIR
    assert config.trial_code_directory == expanded and not config.use_annotation
    assert "_nni_annotation_param('trial/width/choice')" in (expanded / "trial.py").read_text()
    assert (expanded / "helpers" / "__init__.py").read_bytes() == (annotated / "helpers" / "__init__.py").read_bytes()
    assert _snapshot(annotated) == before and (annotated / "trial.py").stat().st_mode & 0o777 == 0o444


def test_the_cli_runs_it_and_dry_run_writes_nothing(annotated: Path, tmp_path: Path) -> None:
    _need_nni()
    before = _snapshot(annotated)
    path = _config(tmp_path, maxTrialNumber=2, trialConcurrency=1)
    cli = [sys.executable, "-m", "nni_manager", "run", "--plain", "--no-webui"]
    dry = subprocess.run([*cli, "--dry-run", str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert _snapshot(annotated) == before and not (tmp_path / "exps").exists()

    run = subprocess.run([*cli, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "stopped: maxTrialNumber (2) reached" in run.stdout, run.stdout
    (exp_dir,) = (tmp_path / "exps").iterdir()
    assert (exp_dir / annotations.EXPANDED_DIR / "trial.py").is_file()
    assert _snapshot(annotated) == before


def test_loading_needs_no_nni_on_the_manager(annotated: Path, tmp_path: Path) -> None:
    """NNI 3.0 has no annotation tool to call: the manager expands the code itself, so a manager
    where `import nni` fails loads the config (only the trials import nni, where they run)."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys
        class _NoNni:
            def find_spec(self, name, path=None, target=None):
                if name == "nni" or name.startswith("nni."):
                    raise ModuleNotFoundError("No module named 'nni' (blocked for this test)")
        sys.meta_path.insert(0, _NoNni())
    """))
    script = textwrap.dedent(f"""
        import importlib.util, sys
        from pathlib import Path
        try:
            import nni
        except ModuleNotFoundError:
            print("nni blocked")
        from nni_manager.loader import load_config
        from nni_manager.annotations import expand
        config = load_config({str(_config(tmp_path))!r})
        print(sorted(config.search_space))
        expand(config.trial_code_directory, Path({str(tmp_path / 'copy')!r}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "nni blocked\n['trial/rate/choice', 'trial/width/choice']\n"
    assert "_nni_annotation_param" in (tmp_path / "copy" / "trial.py").read_text()


def test_expanding_again_refreshes_the_copy_in_place(annotated: Path, tmp_path: Path) -> None:
    """As on a resume: files a running trial wrote in its folder stay; the code is rewritten."""
    out = tmp_path / "out"
    first = annotations.expand(annotated, out)
    (out / "checkpoint.bin").write_bytes(b"trial output")
    (out / "trial.py").chmod(0o644)
    (out / "trial.py").write_text("stale")
    assert annotations.expand(annotated, out) == first
    assert (out / "checkpoint.bin").read_bytes() == b"trial output"
    assert "_nni_annotation_param" in (out / "trial.py").read_text()


def test_experiments_kept_inside_the_code_folder_are_not_copied(tmp_path: Path) -> None:
    """`trialCodeDirectory: .` with `experimentWorkingDirectory: exps`: each run's copy leaves the
    experiments out (no copy of itself, no earlier experiment's files)."""
    (tmp_path / "trial.py").write_text(textwrap.dedent(ANNOTATED))
    path = _config(tmp_path, trialCodeDirectory=".", maxTrialNumber=1, trialConcurrency=1)
    for _ in range(2):
        result = asyncio.run(Experiment(load_config(path), poll_interval=0.2).run())
        assert [t.status for t in result.trials] == [TrialJobStatus.SUCCEEDED], [t.message for t in result.trials]
        copy = result.experiment_dir / annotations.EXPANDED_DIR
        assert sorted(p.name for p in copy.iterdir()) == ["config.yml", "trial.py"]
    assert len(list((tmp_path / "exps").iterdir())) == 2


def test_a_search_space_as_well_is_refused(annotated: Path, tmp_path: Path) -> None:
    for extra in ({"searchSpace": {"x": {"_type": "choice", "_value": [1]}}}, {"searchSpaceFile": "space.json"}):
        (tmp_path / "space.json").write_text('{"x": {"_type": "choice", "_value": [1]}}')
        with pytest.raises(ConfigError) as info:
            load_config(_config(tmp_path, **extra))
        assert "useAnnotation" in str(info.value) and "searchSpace" in info.value.field


def test_code_without_annotations_is_refused(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "trial.py").write_text("import nni\nnni.report_final_result(1)\n")
    with pytest.raises(ConfigError) as info:
        load_config(_config(tmp_path))
    assert info.value.field == "useAnnotation" and "no `'''@nni.variable" in str(info.value)


@pytest.mark.parametrize("body, problem", [
    ('"""@nni.variable(nni.choice(1, 2), name=x)"""\ny = 1\n', "names `x` but the next line assigns `y`"),
    ('"""@nni.variable(nni.choice(1, 2), name=x)"""\n', "annotates nothing"),
    ('"""@nni.variable(nni.uniform(a, 2), name=x)"""\nx = 1\n', "nni.uniform takes number literals"),
    ('"""@nni.mutable_layers({layer_choice: [f()], layer_output: y})"""\n', "classic NAS annotation"),
    ('"""@nni.report_final_result(1"""\n', "is not a Python expression"),
    ('"""@nni.variable(nni.choice(1), name=x)"""\nx = 1\n"""@nni.variable(nni.choice(2), name=x)"""\nx = 2\n',
     "annotated twice with different values"),
])
def test_a_wrong_annotation_names_file_and_line(tmp_path: Path, body: str, problem: str) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "trial.py").write_text("import os\n" + body)
    with pytest.raises(ConfigError) as info:
        load_config(_config(tmp_path))
    assert problem in str(info.value) and f"{tmp_path / 'code' / 'trial.py'}:" in str(info.value)


def test_function_choice_and_scopes_expand_to_runnable_code(tmp_path: Path) -> None:
    """function_choice, a target inside a class, nested blocks and `from __future__`: the expanded
    code runs with the real SDK and a parameter.cfg, and reports what the parameters chose."""
    code, out = tmp_path / "code", tmp_path / "out"
    code.mkdir()
    (code / "trial.py").write_text(textwrap.dedent('''
        from __future__ import annotations
        def double(x): return 2 * x
        def square(x): return x * x
        class Model:
            def build(self):
                """@nni.variable(nni.choice('relu', 'tanh'), name=self.act)"""
                self.act = 'relu'
                return self.act
        """@nni.function_choice(double(3), square(3), name=op)"""
        value = double(3) + 1
        if value:
            """@nni.variable(nni.quniform(1, 5, 1), name=k)"""
            k = 1
        """@nni.report_final_result([value, Model().build(), k])"""
    '''))
    space = annotations.expand(code, out)
    assert space == {"trial/self.act/choice": {"_type": "choice", "_value": ["relu", "tanh"]},
                     "trial/op/function_choice": {"_type": "choice", "_value": ["double(3)", "square(3)"]},
                     "trial/k/quniform": {"_type": "quniform", "_value": [1, 5, 1]}}
    _need_nni()  # the real SDK reads the parameters from parameter.cfg, as a local NNI trial
    sysdir = tmp_path / "sys"
    (sysdir / ".nni").mkdir(parents=True)
    chosen = {"trial/self.act/choice": "tanh", "trial/op/function_choice": "square(3)", "trial/k/quniform": 4}
    (sysdir / "parameter.cfg").write_text(json.dumps({"parameter_id": 0, "parameter_source": "algorithm",
                                                       "parameters": chosen, "parameter_index": 0}))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NNI_PLATFORM": "local", "NNI_SYS_DIR": str(sysdir),
           "NNI_OUTPUT_DIR": str(sysdir), "NNI_TRIAL_JOB_ID": "abcde", "NNI_EXP_ID": "expid123", "NNI_TRIAL_SEQ_ID": "0"}
    run = subprocess.run([sys.executable, "trial.py"], cwd=out, capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    metrics = (sysdir / ".nni" / "metrics").read_bytes()
    assert b'"type": "FINAL"' in metrics and json.dumps(json.dumps([10, "tanh", 4])).encode() in metrics, metrics
