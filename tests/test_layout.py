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
    WINGS,
    cycles,
    exports,
    imports_of,
    modules,
    notebooks,
    stage_of,
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


# the package root: the foundation every wing speaks (rank 0) and the front doors (rank 9)
ROOT_RANK = {"util": 0, "contracts": 0, "viz": 0, "gpu": 9, "cli": 9}


# a wing's command (`qmind data gen CONFIG`) reads a run's config file: the one import of a later
# wing's module, by a command shell, of the config loader's public names
COMMAND_READS = {("data_cli", "config")}


def _rank(module: str) -> int:
    "Where a module's wing stands: the foundation, then the wings in their order, the front doors."
    wing = wing_of(MODULES[module])
    return ROOT_RANK[module] if not wing else 1 + WINGS.index(wing)


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
    order = stage_of(MODULES)
    graph = {m: imports_of(p, MODULES) for m, p in MODULES.items()}
    bad = []
    for a, bs in graph.items():
        for b in sorted(bs):
            ra, rb = _rank(a), _rank(b)
            same = wing_of(MODULES[a]) == wing_of(MODULES[b])
            if same and order[b] > order[a]:
                bad.append(f"{a} ({order[a]:02d}) imports a later chapter, {b} ({order[b]:02d})")
            elif not same and (rb > ra or (rb == ra and ra != 9)) and (a, b) not in COMMAND_READS:
                bad.append(
                    f"{a} ({wing_of(MODULES[a]) or 'root'}) imports "
                    f"{b} ({wing_of(MODULES[b]) or 'root'})"
                )
    # serve and sweeps stand side by side: neither may import the other
    for a, bs in graph.items():
        for b in bs:
            if {wing_of(MODULES[a]), wing_of(MODULES[b])} == {"serve", "sweeps"}:
                bad.append(f"{a} imports {b} sideways (serve <-> sweeps)")
    assert not bad, "imports against the wings' order:\n" + "\n".join(sorted(set(bad)))
    assert not cycles(graph), cycles(graph)


def test_the_rule_itself_catches_a_sideways_import():
    "A known answer: the check above flags a serving module that imports the sweeps."
    assert _rank("renderer") < _rank("sweep") and wing_of(MODULES["renderer"]) == "serve"
    assert _rank("engine") < _rank("dataset") < _rank("train") < _rank("renderer") < _rank("cli")


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
