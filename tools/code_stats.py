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


# the package root: the foundation every wing speaks (rank 0) and the front doors (rank 9)
ROOT_RANK = {"util": 0, "contracts": 0, "viz": 0, "gpu": 9, "cli": 9}
# a wing's command (`qmind data gen CONFIG`) reads a run's config file: the one import of a later
# wing's module, by a command shell, of the config loader's public names
COMMAND_READS = {("data_cli", "config")}


def rank(mods, module: str) -> int:
    "Where a module's wing stands: the foundation, then the wings in their order, the front doors."
    wing = wing_of(mods[module])
    return ROOT_RANK[module] if not wing else 1 + WINGS.index(wing)


def against_the_wings(mods, graph) -> list[str]:
    """Imports against the wings' order: into a later wing (or serve <-> sweeps, which stand side by
    side), or, within a wing, into a later chapter."""
    order, bad = stage_of(mods), []
    for a, bs in graph.items():
        wa = wing_of(mods[a])
        for b in sorted(bs):
            wb, ra, rb = wing_of(mods[b]), rank(mods, a), rank(mods, b)
            if wa == wb and order[b] > order[a]:
                bad.append(f"{a} ({order[a]:02d}) imports a later chapter, {b} ({order[b]:02d})")
            elif wa != wb and (rb > ra or (rb == ra and ra != 9)) and (a, b) not in COMMAND_READS:
                bad.append(f"{a} ({wa or 'root'}) imports {b} ({wb or 'root'})")
            elif {wa, wb} == {"serve", "sweeps"}:
                bad.append(f"{a} imports {b} sideways (serve <-> sweeps)")
    return bad


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


def functions(mods) -> dict[str, int]:
    "Non-blank lines of every function and method: {module.qualname: lines}."
    out = {}
    for name, p in mods.items():
        _sizes(ast.parse(p.read_text()), name, p.read_text().splitlines(), out)
    return out


def _sizes(node, prefix: str, src: list[str], out: dict) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            q = f"{prefix}.{child.name}"
            if not isinstance(child, ast.ClassDef):
                body = src[child.lineno - 1 : child.end_lineno]
                out[q] = sum(1 for ln in body if ln.strip())
            _sizes(child, q, src, out)


def enum_values(mods, classes=("ThemeEnc", "MaterialEnc")) -> set[str]:
    "The values of the encoding enums, read from the config module."
    found = set()
    for node in ast.walk(ast.parse(mods["config"].read_text())):
        if isinstance(node, ast.ClassDef) and node.name in classes:
            for a in node.body:
                if isinstance(a, ast.Assign) and isinstance(a.value, ast.Constant):
                    found.add(a.value.value)
    return found


def _strs(node) -> list[str]:
    "String constants a comparison or a dict literal holds directly (or in a tuple, list or set)."
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strs(e)]
    return []


ABOUT_ENCODINGS = re.compile(r"enc|theme|lighting|material|kind")


def name_comparisons(mods, names: set[str]) -> dict[str, int]:
    """Per module: comparisons (==, !=, in) of an encoding's value spelled as a string (the other
    side names an encoding, a theme, a lighting or a material), and dict literals keyed on two or
    more of them (a table by encoding), where a registered class would do."""
    out = {}
    for m, p in mods.items():
        n, text = 0, p.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                hit = any(s in names for side in sides for s in _strs(side))
                other = " ".join(ast.get_source_segment(text, s) or "" for s in sides)
                n += hit and bool(ABOUT_ENCODINGS.search(other))
            elif isinstance(node, ast.Dict):
                n += sum(s in names for k in node.keys if k is not None for s in _strs(k)) >= 2
        if n:
            out[m] = n
    return out


def ddim_parsers(mods) -> dict[str, list[str]]:
    """Per module, the functions that spell or parse an eval.json `ddim_K` key: a literal `ddim_K`
    or `ddim_` (a prefix to test or strip), or an f-string starting `ddim_` (not the config field
    `ddim_steps`)."""
    out = {}
    for m, p in mods.items():
        tree = ast.parse(p.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                lit = isinstance(node, ast.Constant) and isinstance(node.value, str)
                text = node.value if lit else None
                if isinstance(node, ast.JoinedStr) and node.values:
                    head = node.values[0]
                    text = head.value if isinstance(head, ast.Constant) else None
                if isinstance(text, str) and re.match(r"ddim_(\d|$)", text):
                    out.setdefault(m, []).append(fn.name)
                    break
    return {m: sorted(set(fs)) for m, fs in out.items()}


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
    upward = sorted(against_the_wings(mods, graph))
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
    print(f"imports against the wings' order: {upward or 0}")
    print(
        f"exported cells: {len(cells)}, median {statistics.median(cells):.0f} lines,"
        f" p95 {pct(cells, 0.95)}, longest {max(cells)}"
    )
    wings = sorted({wing_of(p) for p in mods.values()} - {""})
    print(f"sub-packages: {len(wings)} ({', '.join(wings)})")
    fns = functions(mods)
    top = sorted(fns, key=fns.get)[-3:][::-1]
    print("largest functions:", ", ".join(f"{f} {fns[f]}" for f in top))
    comps = name_comparisons(mods, enum_values(mods))
    print(
        f"string comparisons of encoding names: {sum(comps.values())}"
        + (f" ({', '.join(f'{m} {n}' for m, n in sorted(comps.items()))})" if comps else "")
    )
    tools = {f"tools/{p.stem}": p for p in sorted((ROOT / "tools").glob("*.py"))}
    ddim = ddim_parsers({**mods, **{k: p for k, p in tools.items() if k != "tools/code_stats"}})
    print(
        f"functions that spell or parse ddim_ keys: {sum(map(len, ddim.values()))} in {len(ddim)}"
        f" modules ({', '.join(sorted(ddim))})"
    )
    words = markdown_words()
    print(f"markdown cells: {len(words)}, mean {statistics.mean(words):.0f} words")


if __name__ == "__main__":
    sys.exit(main())
