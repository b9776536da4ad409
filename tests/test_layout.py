"""The layout a reader relies on (issue 31): one notebook per module and one concern per module,
named in its first line; imports that only go down the chapters' order, with no circle; the README's
and the home page's layout tables true. These replace the 600-line cap, which was met by widening
lines."""

import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "qmind_render"
NBS = ROOT / "nbs"
MODULES = {
    p.stem: p for p in sorted(PKG.glob("*.py")) if p.name not in ("_modidx.py", "__init__.py")
}


def _exports() -> dict[str, str]:
    "Each notebook's module, from its `#| default_exp` line: {notebook stem: module}."
    out = {}
    for nb in sorted(NBS.glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            m = re.match(r"#\|\s*default_exp\s+(\w+)", "".join(cell["source"]))
            if m:
                out[nb.stem] = m.group(1)
    return out


def _imports(path: Path) -> set[str]:
    "The package modules `path` imports: import statements anywhere, and importlib by literal name."
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.level or node.module.startswith("qmind_render"):
                found.add(node.module.split(".")[-1])
                found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[-1] for a in node.names if a.name.startswith("qmind"))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            found.update(
                a.value.split(".")[-1]
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str)
            )
    return (found & set(MODULES)) - {path.stem}


def test_one_notebook_per_module():
    exports = _exports()
    by_module = {}
    for nb, mod in exports.items():
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
    order = {mod: int(nb.split("_")[0]) for nb, mod in _exports().items()}
    graph = {m: _imports(p) for m, p in MODULES.items()}
    upward = [
        f"{a} ({order[a]:02d}) imports {b} ({order[b]:02d})"
        for a, bs in graph.items()
        for b in sorted(bs)
        if order[b] > order[a]
    ]
    assert not upward, "a module imports a later chapter's:\n" + "\n".join(upward)
    # with every edge pointing to a lower or equal number, a circle can only be within one number
    same = [(a, b) for a, bs in graph.items() for b in bs if order[b] == order[a]]
    assert not [(a, b) for a, b in same if a in graph.get(b, ())], same


def test_the_layout_tables_name_every_chapter():
    chapters = {nb for nb in _exports()} | {p.stem for p in NBS.glob("[0-9]*.ipynb")}
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
