"""NNI annotations (`useAnnotation: true`): the search space from the trial code's
`'''@nni.variable(nni.choice(...), name=x)'''` strings, and an expanded copy of the code that
reads each value from the tuner's parameters.

NNI <= 2.10 did this with `nni.tools.annotation` in nnictl; NNI 3.0 removed that tool, its
runtime (`nni.choice` as a parameter lookup) and nnictl's support. This module does the same
from the standard library, with NNI 2.x's rules (the syntax, keys `module/name/function`,
choice values: a literal as itself, any other option as its source text), and writes code that
needs only `nni.get_next_parameter`, `nni.get_current_parameter` and the report calls, which
NNI 3 keeps. The user's directory is only read: the copy goes where the caller says.
"""
from __future__ import annotations

import ast
import os
import shutil
from pathlib import Path
from collections.abc import Callable, Sequence

from nni_manager.types import ParameterSpec, SearchSpace
from nni_manager.config import ConfigError, ExperimentConfig

FIELD = "useAnnotation"
EXPANDED_DIR = "annotated_code"  # in the experiment's directory: kept and removed with it
# The one helper each expanded file gets: the tuner's value for `key`, fetching the
# parameters first if the code did not (NNI 2's smart parameters did the same).
_HELPER = '''
def _nni_annotation_param(key):
    if nni.get_current_parameter() is None:
        nni.get_next_parameter()
    return nni.get_current_parameter(key)
'''
_CALLS = ("get_next_parameter", "report_intermediate_result", "report_final_result")
_NUMERIC = ("randint", "uniform", "quniform", "loguniform", "qloguniform", "normal", "qnormal",
            "lognormal", "qlognormal")
_NAS = ("mutable_layers", "training_update")


def search_space(code_dir: Path, skip: Path | None = None) -> SearchSpace:
    """The search space the annotations under `code_dir` define (leaving out `skip`, the
    experiments' folder when it lies inside the code); writes nothing."""
    space: SearchSpace = {}
    for path, module in _modules(code_dir, skip):
        _expand(path, module, space)
    if not space:
        raise ConfigError(FIELD, f"no `'''@nni.variable(...)'''` or `'''@nni.function_choice(...)'''` "
                          f"annotation found in the .py files under {code_dir}",
                          "annotate the trial code, or remove useAnnotation and give a searchSpace")
    return space


def expand(code_dir: Path, dst: Path, skip: Path | None = None) -> SearchSpace:
    """Copy `code_dir` to `dst` with each annotated .py file rewritten; files without annotations
    are copied as they are, and `skip` (default: `dst`) is left out when inside the code, so a
    copy never contains itself. An existing `dst` is refreshed in place, not removed: a resumed
    experiment's running trials keep their working folder. Returns the search space."""
    space: SearchSpace = {}
    left_out = (skip or dst).resolve()

    def ignore(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if (Path(folder) / n).resolve() == left_out]

    shutil.copytree(code_dir, dst, symlinks=True, dirs_exist_ok=True, copy_function=_replace, ignore=ignore)
    for path, module in _modules(code_dir, left_out):
        code = _expand(path, module, space)
        if code is not None:
            target = dst / path.relative_to(code_dir)
            target.unlink()  # the copy of a read-only file is read-only too
            target.write_text(code)
    return space


def _replace(src: str, dst: str) -> None:
    """copy2 that also replaces a read-only copy left by an earlier run."""
    Path(dst).unlink(missing_ok=True)
    shutil.copy2(src, dst)


def expand_annotations(config: ExperimentConfig, experiment_dir: Path) -> None:
    """What NNI 2's nnictl did before a run: trials run an expanded copy of the code, with the
    search space found in it; the config then says so (`useAnnotation` false, as nnictl left it)."""
    dst = experiment_dir / EXPANDED_DIR
    skip = Path(config.experiment_working_directory).expanduser()
    config.search_space = expand(Path(config.trial_code_directory).expanduser(), dst,
                                 skip if dst.resolve().is_relative_to(skip.resolve()) else dst)
    if not config.search_space:
        raise ConfigError(FIELD, f"no annotation left in {config.trial_code_directory}",
                          "annotate the trial code, or remove useAnnotation and give a searchSpace")
    config.trial_code_directory = dst
    config.use_annotation = False


def _modules(code_dir: Path, skip: Path | None = None) -> list[tuple[Path, str]]:
    """Every .py file with its module name (`pkg.mod`), in a stable order, outside `skip`."""
    found = []
    left_out = skip.resolve() if skip is not None else None
    for root, dirs, files in os.walk(code_dir):
        dirs[:] = sorted(d for d in dirs if (Path(root) / d).resolve() != left_out)
        for name in sorted(files):
            if name.endswith(".py"):
                path = Path(root) / name
                found.append((path, ".".join(path.relative_to(code_dir).with_suffix("").parts)))
    return found


def _expand(path: Path, module: str, space: SearchSpace) -> str | None:
    """The expanded source of one file (None when it has no annotation); adds to `space`."""
    source = path.read_bytes()
    try:
        tree = ast.parse(source, str(path))
    except (SyntaxError, ValueError) as exc:
        if b"@nni." not in source:
            return None  # not trial code we must rewrite (NNI would refuse it; a stray file is harmless)
        raise ConfigError(FIELD, f"{path} is not valid Python: {exc}", "fix the trial code") from None
    rewriter = _Rewriter(path, module, space)
    rewriter.visit(tree)
    if not rewriter.annotated:
        return None
    body = tree.body
    at = 0
    while at < len(body) and (isinstance(stmt := body[at], ast.ImportFrom) and stmt.module == "__future__"
                              or at == 0 and _docstring(stmt)):
        at += 1
    body[at:at] = [ast.Import(names=[ast.alias(name="nni")]), *ast.parse(_HELPER).body]
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def _docstring(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            and not node.value.value.startswith("@nni."))


def _annotation(node: ast.stmt) -> str | None:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        text = node.value.value.strip()
        return text[1:] if text.startswith("@nni.") else None
    return None


class _Rewriter(ast.NodeVisitor):
    """Replaces the annotation strings of every statement list, in place."""

    def __init__(self, path: Path, module: str, space: SearchSpace) -> None:
        self.path, self.module, self.space = path, module, space
        self.annotated = False

    def error(self, node: ast.AST, problem: str, fix: str = "see NNI's annotation syntax") -> ConfigError:
        return ConfigError(FIELD, f"{self.path}:{getattr(node, 'lineno', '?')}: {problem}", fix)

    def generic_visit(self, node: ast.AST) -> None:
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                setattr(node, name, self.block(block))
        super().generic_visit(node)

    def block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        pending: tuple[ast.stmt, ast.Call] | None = None
        for stmt in stmts:
            text = _annotation(stmt)
            if text is None:
                if pending is not None:
                    stmt = self.apply(stmt, *pending)
                    pending = None
                out.append(stmt)
                continue
            if pending is not None:
                raise self.error(stmt, "an annotation annotates another annotation",
                                 "put the annotated statement right after the annotation")
            self.annotated = True
            call = self.parse(stmt, text)
            func = call.func.attr  # type: ignore[attr-defined]
            if func in _CALLS:
                out.append(ast.copy_location(ast.Expr(value=call), stmt))
            elif func in ("variable", "function_choice"):
                pending = (stmt, call)
            elif func in _NAS:
                raise self.error(stmt, f"`@nni.{func}` is NNI's classic NAS annotation, which is not supported",
                                 "write the model with NNI's NAS API, or tune hyperparameters only")
            else:
                raise self.error(stmt, f"unknown annotation `@nni.{func}`",
                                 "use nni.variable, nni.function_choice, nni.get_next_parameter, "
                                 "nni.report_intermediate_result or nni.report_final_result")
        if pending is not None:
            raise self.error(pending[0], "the annotation annotates nothing",
                             "put the annotated statement right after it")
        return out

    def parse(self, stmt: ast.stmt, text: str) -> ast.Call:
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError:
            raise self.error(stmt, f"the annotation `@{text}` is not a Python expression") from None
        call = tree.body
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name) and call.func.value.id == "nni"):
            raise self.error(stmt, f"the annotation `@{text}` is not a call of an nni function")
        return ast.copy_location(call, stmt)

    def apply(self, stmt: ast.stmt, note: ast.stmt, call: ast.Call) -> ast.stmt:
        """The statement after an nni.variable / nni.function_choice annotation, rewritten."""
        name = self.name(note, call)
        func = call.func.attr  # type: ignore[attr-defined]
        if func == "variable":
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
                raise self.error(stmt, "nni.variable must annotate an assignment to one variable")
            if ast.unparse(stmt.targets[0]) != name:
                raise self.error(stmt, f"nni.variable names `{name}` but the next line assigns "
                                 f"`{ast.unparse(stmt.targets[0])}`")
            if len(call.args) != 1 or not _nni_call(call.args[0]):
                raise self.error(note, "nni.variable takes one nni.<distribution>(...) and name=",
                                 "e.g. '''@nni.variable(nni.choice(0.1, 0.01), name=lr)'''")
            dist: ast.Call = call.args[0]  # type: ignore[assignment]
            kind = dist.func.attr  # type: ignore[attr-defined]
            if kind == "choice":
                stmt.value = self.choice(note, name, "choice", dist.args, lambda a: a)
            elif kind in _NUMERIC:
                try:
                    args = [ast.literal_eval(a) for a in dist.args]
                except ValueError:
                    args = None
                if not args or not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
                    raise self.error(note, f"nni.{kind} takes number literals")
                key = self.add(note, name, kind, args)
                stmt.value = _lookup(key)
            else:
                raise self.error(note, f"unknown distribution nni.{kind}",
                                 f"use choice or one of: {', '.join(_NUMERIC)}")
            return stmt
        # function_choice: the calls it lists, wherever they appear in the statement, become the chosen one
        if not call.args or not all(isinstance(a, ast.Call) for a in call.args):
            raise self.error(note, "nni.function_choice lists function calls",
                             "e.g. nni.function_choice(f(x), g(x), name=f)")
        chosen = self.choice(note, name, "function_choice", call.args,
                             lambda a: ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                                                                     kw_defaults=[], defaults=[]), body=a))
        wanted = {ast.dump(a) for a in call.args}
        replacer = _CallReplacer(wanted, ast.Call(func=chosen, args=[], keywords=[]))
        stmt = replacer.visit(stmt)
        if not replacer.replaced:
            raise self.error(stmt, f"none of the calls nni.function_choice lists for `{name}` is on the next line")
        return stmt

    def name(self, note: ast.stmt, call: ast.Call) -> str:
        names = [k for k in call.keywords if k.arg == "name"]
        if len(call.keywords) != 1 or not names:
            raise self.error(note, "the annotation needs one keyword argument, name=", "e.g. name=learning_rate")
        return ast.unparse(names[0].value)

    def choice(self, note: ast.stmt, name: str, func: str, options: list[ast.expr],
               wrap: Callable[[ast.expr], ast.expr]) -> ast.expr:
        if not options:
            raise self.error(note, f"nni.{func} for `{name}` lists no option")
        keys = [o.value if isinstance(o, ast.Constant) else ast.unparse(o) for o in options]
        key = self.add(note, name, func, keys)
        table = ast.Dict(keys=[ast.Constant(value=k) for k in keys], values=[wrap(o) for o in options])
        return ast.Subscript(value=table, slice=_lookup(key), ctx=ast.Load())

    def add(self, note: ast.stmt, name: str, func: str, values: Sequence[object]) -> str:
        key = f"{self.module}/{name}/{func}"
        spec: ParameterSpec = {"_type": "choice" if func == "function_choice" else func, "_value": list(values)}
        if self.space.get(key, spec) != spec:
            raise self.error(note, f"`{name}` is annotated twice with different values",
                             "give each annotated parameter its own name")
        self.space[key] = spec
        return key


class _CallReplacer(ast.NodeTransformer):
    def __init__(self, wanted: set[str], target: ast.expr) -> None:
        self.wanted, self.target, self.replaced = wanted, target, False

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if ast.dump(node) in self.wanted:
            self.replaced = True
            return self.target
        return self.generic_visit(node)


def _nni_call(node: ast.expr) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "nni")


def _lookup(key: str) -> ast.expr:
    return ast.Call(func=ast.Name(id="_nni_annotation_param", ctx=ast.Load()), args=[ast.Constant(value=key)],
                    keywords=[])
