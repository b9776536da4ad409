"""The code's shape in numbers (issue 31): line density, long lines, module sizes, import order,
cells.

python tools/code_stats.py          # a table on stdout
"""

import ast
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "qmind_render"
NBS = ROOT / "nbs"


# the wings, in the order they may import each other: a wing imports the package root's foundation
# (util, contracts, viz) and the wings before it; the root's front doors (gpu, cli) import any wing
WINGS = ("world", "data", "core", "serve", "sweeps", "docs")


def modules():
    "Every exported module but the nbdev index and the packages' inits, by name (names are unique)."
    found = [
        p
        for p in sorted(PKG.rglob("*.py"))
        if p.stem not in ("_modidx", "__init__") and p.parent.name not in ("assets", "contracts")
    ]
    return {p.stem: p for p in found}


def wing_of(path) -> str:
    "The wing a module or notebook lives in: its folder under the package or nbs/ ('' at the root)."
    rel = Path(path).resolve().relative_to(PKG if PKG in Path(path).resolve().parents else NBS)
    return rel.parts[0] if len(rel.parts) > 1 else ""


def notebooks():
    "The chapters: every notebook under nbs/ but the talks, the papermill templates, _ and . ones."
    return [
        p
        for p in sorted(NBS.rglob("*.ipynb"))
        if not any(s[0] in "_." or s in ("talks", "experiments") for s in p.relative_to(NBS).parts)
    ]


def exports() -> dict[str, str]:
    "Each notebook's module, from its `#| default_exp` line: {notebook stem: module}."
    out = {}
    for nb in notebooks():
        for cell in json.loads(nb.read_text())["cells"]:
            m = re.match(r"#\|\s*default_exp\s+([\w.]+)", "".join(cell["source"]))
            if m:
                out[nb.stem] = m.group(1).split(".")[-1]
    return out


def stage_of(mods) -> dict[str, int]:
    "Each module's notebook number (the stage order)."
    made = exports()
    return {m: int(nb.split("_")[0]) for nb, m in made.items() if m in mods and nb[:2].isdigit()}


def imports_of(path, mods) -> set[str]:
    """The package modules a module imports: import statements anywhere, and importlib by literal
    name."""
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
    return (found & set(mods)) - {path.stem}


def cycles(graph):
    "Strongly connected groups of more than one module (Tarjan)."
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def exported_cells():
    "Line counts of every exported code cell."
    sizes = []
    for nb in notebooks():
        for cell in json.loads(nb.read_text())["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] == "code" and re.match(r"\s*#\|\s*export", src):
                body = [ln for ln in src.splitlines() if not ln.startswith("#|")]
                sizes.append(len(body))
    return sizes


def markdown_words():
    "Words in each markdown cell of the chapters."
    counts = []
    for nb in notebooks():
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                counts.append(len("".join(cell["source"]).split()))
    return counts


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    mods = modules()
    lines = []
    sizes = {}
    generated = []  # nbdev's __all__, which it wraps at 120 columns
    for name, p in mods.items():
        text = [ln for ln in p.read_text().splitlines() if ln.strip()]
        sizes[name] = len(text)
        lines += text
        inside = False
        for ln in text:
            inside = inside or ln.startswith("__all__ = [")
            if inside and len(ln) > 100:
                generated.append(ln)
            inside = inside and "]" not in ln
    graph = {name: imports_of(p, mods) for name, p in mods.items()}
    order = stage_of(mods)
    upward = sorted(
        f"{a} ({order[a]}) -> {b} ({order[b]})"
        for a, bs in graph.items()
        for b in bs
        if a in order and b in order and order[b] > order[a]
    )
    cells = exported_cells()
    big = max(sizes, key=sizes.get)
    print(f"modules: {len(mods)}, non-blank lines: {len(lines)}")
    print(f"mean characters per non-blank line: {statistics.mean(map(len, lines)):.1f}")
    over = sum(len(ln) > 100 for ln in lines)
    print(f"lines over 100 characters: {over} ({len(generated)} of them nbdev's __all__)")
    print(f"lines over 120 characters: {sum(len(ln) > 120 for ln in lines)}")
    print(f"largest module: {big}.py, {sizes[big]} non-blank lines")
    print("six largest:", ", ".join(f"{m} {sizes[m]}" for m in sorted(sizes, key=sizes.get)[-6:]))
    print(f"circles: {cycles(graph) or 0}")
    print(f"upward imports: {upward or 0}")
    print(
        f"exported cells: {len(cells)}, median {statistics.median(cells):.0f} lines,"
        f" p95 {pct(cells, 0.95)}, longest {max(cells)}"
    )
    words = markdown_words()
    print(f"markdown cells: {len(words)}, mean {statistics.mean(words):.0f} words")


if __name__ == "__main__":
    sys.exit(main())
