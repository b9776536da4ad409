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
from code_stats import (  # noqa: E402
    ROOT_RANK,
    WINGS,
    against_the_wings,
    cycles,
    rank,
    exports,
    imports_of,
    modules,
    notebooks,
    wing_of,
)

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


def _rank(module: str) -> int:
    return rank(MODULES, module)


def test_every_module_lives_in_a_wing_or_is_named_at_the_root():
    stray = [m for m, p in MODULES.items() if not wing_of(p) and m not in ROOT_RANK]
    assert not stray, (
        f"modules at the package root that are neither foundation nor front door: {stray}"
    )
    assert {wing_of(p) for p in MODULES.values()} == {"", *WINGS}


def test_each_notebook_lives_in_its_modules_wing():
    for nb in notebooks():
        made = exports().get(nb.stem)
        if made:
            assert wing_of(nb) == wing_of(MODULES[made]), f"{nb} exports {made} into another wing"


def test_wings_import_the_foundation_and_earlier_wings_never_sideways():
    """A wing imports the root's foundation and the wings before it in WINGS (world, data, core,
    serve, sweeps, docs): serving never imports the sweeps, nor the sweeps serving; within a wing,
    imports go down the chapters' order; no circle anywhere."""
    graph = {m: imports_of(p, MODULES) for m, p in MODULES.items()}
    bad = against_the_wings(MODULES, graph)
    assert not bad, "imports against the wings' order:\n" + "\n".join(sorted(set(bad)))
    assert not cycles(graph), cycles(graph)


def test_the_rule_itself_catches_imports_against_the_wings():
    "Known answers: the check flags a sideways, an upward and a later-chapter import, no downward."
    assert _rank("engine") < _rank("dataset") < _rank("train") < _rank("renderer") < _rank("cli")
    flagged = against_the_wings(
        MODULES,
        {
            "renderer": {"sweep", "train"},  # serve -> sweeps: sideways; serve -> core: fine
            "engine": {"dataset"},  # world -> data: upward
            "model": {"evaluate"},  # core 40 -> core 60: a later chapter
            "cli": {"renderer"},  # a front door may import any wing
        },
    )
    assert len(flagged) == 3 and all(("train" not in f and "cli" not in f) for f in flagged), (
        flagged
    )


def test_the_layout_tables_name_every_chapter():
    chapters = set(exports()) | {p.stem for p in notebooks() if p.stem[:2].isdigit()}
    readme = (ROOT / "README.md").read_text()
    rows = set(re.findall(r"^ {2,4}(\d\d_\w+)\s", readme, flags=re.M))
    assert rows == chapters, f"README's layout: missing {chapters - rows}, stale {rows - chapters}"
    home = "".join(
        "".join(c["source"]) for c in json.loads((NBS / "index.ipynb").read_text())["cells"]
    )
    listed = set(re.findall(r"\| `(\d\d_\w+)` \|", home))
    assert listed == chapters, (
        f"index.ipynb's table: missing {chapters - listed}, stale {listed - chapters}"
    )
