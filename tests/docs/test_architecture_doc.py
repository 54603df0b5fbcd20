"""docs/ARCHITECTURE.md's module map names every module of the agent and the manager, each in
its own folder: a module added without a line there fails here.

The map is the first code block, a tree read by these rules:
- a line ending in `agent/nni_agent` or `manager/nni_manager` starts that package's part;
- a line whose first word is a folder (`service/`) opens it for the lines indented deeper below;
- `folder/ (a.py, b.py ...)` opens it inside the parentheses;
- every other `name.py` names the module of that name in the folder open at that point.
A package's `__init__.py` is named by its folder.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGES = {"agent/nni_agent": ROOT / "agent" / "nni_agent", "manager/nni_manager": ROOT / "manager" / "nni_manager"}
_TOKEN = re.compile(r"(?<![\w./-])(?:(?P<dir>\w+)/(?=\s)|(?P<file>\w+\.py)\b)|(?P<open>\()|(?P<close>\))")


def named_modules(doc: str) -> set[str]:
    """`package/path/module.py` for every module the map names."""
    tree = re.search(r"```\n(.*?)```", doc, re.S)
    assert tree, "no code block in the document"
    named: set[str] = set()
    package = ""
    indents: list[tuple[int, str]] = []  # (indent, folder) opened by a line's first word
    parens: list[str | None] = []  # one per open parenthesis: the folder it opens, or None
    for line in tree.group(1).splitlines():
        root = re.search(r"\s(agent/nni_agent|manager/nni_manager)\s*$", line)
        if root:
            package, indents, parens = root.group(1), [], []
            continue
        body = line.lstrip(" |")
        indent = len(line) - len(body)
        if not parens:
            while indents and indents[-1][0] >= indent:
                indents.pop()
        first = True
        for m in _TOKEN.finditer(body):
            if m.group("open"):
                before = body[:m.start()].rstrip()
                folder = re.search(r"(?<![\w./-])(\w+)/$", before)
                parens.append(folder.group(1) if folder else None)
            elif m.group("close"):
                if parens:
                    parens.pop()
            elif m.group("dir") and first and not parens:
                rest = body[m.end():].lstrip()
                if not rest.startswith("("):
                    indents.append((indent, m.group("dir")))
            elif m.group("file") and package:
                folders = [f for _, f in indents] + [f for f in parens if f]
                named.add("/".join([package, *folders, m.group("file")]))
            first = False
    return named


def modules() -> set[str]:
    return {f"{name}/{path.relative_to(root).as_posix()}" for name, root in PACKAGES.items()
            for path in root.rglob("*.py") if path.name != "__init__.py"}


def test_the_module_map_names_every_module() -> None:
    missing = sorted(modules() - named_modules(DOC.read_text()))
    assert not missing, ("docs/ARCHITECTURE.md does not name these modules (add a line in its folder's part "
                         "of the map saying what each does):\n  " + "\n  ".join(missing))


def test_the_reader_places_names_in_their_folders() -> None:
    """The reader itself: a name is placed by its folder, however the folder is opened."""
    doc = ("```\n"
           " agent side                 agent/nni_agent\n"
           "   a.py        one (see b.py)\n"
           "   sub/        a part:\n"
           "     c.py      in sub\n"
           "                 continued, d.py\n"
           "   e.py        back at the top\n"
           " manager side               manager/nni_manager\n"
           "   x/          f.py, y/ (g.py, z/ (h.py), i.py), j.py\n"
           "               k.py\n"
           "   l.py        (m.py)\n"
           "```\n")
    assert named_modules(doc) == {
        "agent/nni_agent/a.py", "agent/nni_agent/b.py", "agent/nni_agent/sub/c.py", "agent/nni_agent/sub/d.py",
        "agent/nni_agent/e.py", "manager/nni_manager/x/f.py", "manager/nni_manager/x/y/g.py",
        "manager/nni_manager/x/y/z/h.py", "manager/nni_manager/x/y/i.py", "manager/nni_manager/x/j.py",
        "manager/nni_manager/x/k.py", "manager/nni_manager/l.py", "manager/nni_manager/m.py"}
