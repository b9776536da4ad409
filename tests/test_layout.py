"""The layout a reader relies on (issue 31): one notebook per module and one concern per module,
named in its first line; imports that only go down the chapters' order, with no circle; the README's
and the home page's layout tables true. These replace the 600-line cap, which was met by widening
lines."""

import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
sys.path.insert(0, str(ROOT / "tools"))
from code_stats import cycles, exports, imports_of, modules, stage_of  # noqa: E402

MODULES = modules()


def test_one_notebook_per_module():
    by_module = {}
    for nb, mod in exports().items():
        by_module.setdefault(mod, []).append(nb)
    assert not {m: nbs for m, nbs in by_module.items() if len(nbs) > 1}, "two notebooks, one module"
    assert set(by_module) == set(MODULES), set(by_module) ^ set(MODULES)


def test_each_module_names_its_one_concern_in_its_first_line():
    bad = []
    for name, p in MODULES.items():
        doc = ast.get_docstring(ast.parse(p.read_text()), clean=False) or ""
        first, *rest = doc.split("\n")
        # nbdev adds a line linking the module's page
        more = [line for line in rest if line.strip() and not line.startswith("Docs: ")]
        if not first or len(first) > 94 or more:
            bad.append(f"{name}.py: {first!r}")
    assert not bad, "a module's docstring is its notebook's one-line subtitle:\n" + "\n".join(bad)


def test_imports_only_go_down_the_chapters_and_never_round():
    order = stage_of(MODULES)
    graph = {m: imports_of(p, MODULES) for m, p in MODULES.items()}
    upward = [
        f"{a} ({order[a]:02d}) imports {b} ({order[b]:02d})"
        for a, bs in graph.items()
        for b in sorted(bs)
        if order[b] > order[a]
    ]
    assert not upward, "a module imports a later chapter's:\n" + "\n".join(upward)
    assert not cycles(graph), cycles(graph)


def test_the_layout_tables_name_every_chapter():
    chapters = set(exports()) | {p.stem for p in NBS.glob("[0-9]*.ipynb")}
    readme = (ROOT / "README.md").read_text()
    rows = set(re.findall(r"^  (\d\d_\w+)\s", readme, flags=re.M))
    assert rows == chapters, f"README's layout: missing {chapters - rows}, stale {rows - chapters}"
    home = "".join(
        "".join(c["source"]) for c in json.loads((NBS / "index.ipynb").read_text())["cells"]
    )
    listed = set(re.findall(r"\| `(\d\d_\w+)` \|", home))
    assert listed == chapters, (
        f"index.ipynb's table: missing {chapters - listed}, stale {listed - chapters}"
    )
