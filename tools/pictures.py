"""Store each stage notebook's picture, so a reader on GitHub sees it (`make pictures`).

A stage notebook ends with its picture: the last code cell, tagged `picture` in its cell metadata
(Jupyter: the property inspector's cell tags; `nbdev-clean` keeps tags). This script runs a notebook
as `nbdev-test --flags slow` does (nbdev's runner, in the notebook's folder, `#| slow` cells
included, `#| eval: false` cells skipped), each notebook in a process of its own, and then writes
back the outputs of the tagged cells only (`picture`, and `output`: a small table or printed shape
where it teaches): every other cell's outputs are cleared, so the notebooks
stay small. PNGs are re-encoded without metadata (matplotlib's at 80 dpi), those over 32 kB reduced
to 128 colours, so the same pictures give the same bytes; a notebook whose run fails is left as it
was, and the script exits 1 naming it.

    python tools/pictures.py                      # every notebook in nbs/ tagged `picture`
    python tools/pictures.py nbs/core/40_model.ipynb   # just these
    python tools/pictures.py -j 2                 # two notebooks at a time
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TAG = "picture"
# a small text output that teaches where it stands (a table, a printed shape), kept as a picture is
OUTPUT_TAG = "output"
OUTPUT_LIMIT = 4_000  # bytes of text an `output` cell may keep
DPI = 80
LIMIT = 32_000  # bytes of a PNG kept as it is


def tagged(cell: dict) -> bool:
    return TAG in (cell.get("metadata") or {}).get("tags", [])


def kept(cell: dict) -> bool:
    "A cell whose outputs are stored: the picture, or a small output tagged `output`."
    return bool({TAG, OUTPUT_TAG} & set((cell.get("metadata") or {}).get("tags", [])))


def picture_notebooks(root: Path = ROOT) -> list[Path]:
    """The chapters under `root/nbs` (the wings' folders; not the talks or the papermill templates)
    with a cell tagged `picture` or `output`."""
    return [
        p
        for p in sorted((root / "nbs").rglob("*.ipynb"))
        if not any(
            s in ("talks", "experiments") or s[0] in "_." for s in p.relative_to(root / "nbs").parts
        )
        if any(kept(c) for c in json.loads(p.read_text())["cells"])
    ]


def small_png(b64: str, limit: int = LIMIT) -> str:
    """A PNG re-encoded by PIL (optimised, no text chunks such as matplotlib's Software), reduced to
    128 colours when over `limit` bytes; base64."""
    from PIL import Image

    im, buf = Image.open(io.BytesIO(base64.b64decode(b64))), io.BytesIO()
    im.save(buf, "png", optimize=True)
    # a rendered frame's textures: 128 colours look the same, at a third
    if buf.tell() > limit:
        buf = io.BytesIO()
        im.convert("RGB").quantize(128).save(buf, "png", optimize=True)
    return base64.b64encode(buf.getvalue()).decode()


def _clean_output(o: dict) -> dict:
    o = dict(o)
    if "data" in o:
        # PIL images also offer a JPEG: keep the lossless one only
        png = "image/png" in o["data"]
        o["data"] = {
            k: (small_png(v) if k == "image/png" else v)
            for k, v in o["data"].items()
            if not (png and k == "image/jpeg")
        }
        o["metadata"] = {}
    return o


def execute(path: Path) -> dict[str, list]:
    """Run the notebook at `path` as `nbdev-test --flags slow` does; the outputs of its tagged
    cells, by cell id."""
    from execnb.shell import CaptureShell
    from nbdev.config import get_config
    from nbdev.process import NBProcessor
    from nbdev.test import _skip_cell
    from fastcore.xtras import working_directory

    os.environ["IN_TEST"] = "1"
    nb = NBProcessor(path, rm_directives=False, process=True).nb
    skip = _skip_cell(nb, get_config().tst_flags.split(), ["slow"])
    shell = CaptureShell(path, mpl_format="png")
    shell._run(
        f"from matplotlib_inline.backend_inline import set_matplotlib_formats\n"
        f"set_matplotlib_formats('png', dpi={DPI}, metadata={{'Software': None}})"
    )
    with working_directory(path.parent):
        try:
            shell.run_all(nb, exc_stop=True, preproc=skip)
        # one line for the parent: which cell, what it raised
        except Exception as e:
            bad = next(
                (
                    c
                    for c in nb.cells
                    for o in c.get("outputs", [])
                    if o.get("output_type") == "error"
                ),
                None,
            )
            where = (
                f"cell {bad.id} ({bad.source.splitlines()[0][:60]!r})"
                if bad is not None
                else "a cell"
            )
            print(f"{where} raised {type(e).__name__}: {e}", file=sys.stderr)
            raise SystemExit(1) from None
    return {c.id: [_clean_output(o) for o in c.get("outputs", [])] for c in nb.cells if kept(c)}


def store(path: Path, outputs: dict[str, list]) -> int:
    """Write `outputs` into the tagged cells of the notebook at `path` and clear every other cell's;
    nbdev-clean it. Bytes stored."""
    nb = json.loads(path.read_text())
    n = 0
    for c in nb["cells"]:
        if c["cell_type"] != "code":
            continue
        c["outputs"] = outputs.get(c["id"], []) if kept(c) else []
        n += len(json.dumps(c["outputs"]))
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    subprocess.run(["nbdev-clean", "--fname", str(path)], cwd=ROOT, check=True, capture_output=True)
    return n


def one(path: Path) -> tuple[Path, bool, str]:
    "Run one notebook in a fresh process; store its pictures if it ran."
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as td:
        out = Path(td) / "outputs.json"
        r = subprocess.run(
            [sys.executable, __file__, "--execute", str(path), str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            return path, False, (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        n = store(path, json.loads(out.read_text()))
    return path, True, f"{n / 1e3:.0f} kB of outputs stored ({time.monotonic() - t0:.0f} s)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "notebooks",
        nargs="*",
        type=Path,
        help="default: every notebook in nbs/ with a cell tagged `picture`",
    )
    p.add_argument("-j", "--jobs", type=int, default=1, help="notebooks at a time (default 1)")
    # the child: run one, write its tagged outputs as JSON
    p.add_argument("--execute", nargs=2, type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.execute:
        a.execute[1].write_text(json.dumps(execute(a.execute[0].resolve())))
        return 0
    paths = [x.resolve() for x in a.notebooks] or picture_notebooks()
    untagged = [x for x in paths if x not in picture_notebooks()]
    if untagged:
        print(
            f"pictures: no cell tagged {TAG!r} in {', '.join(x.name for x in untagged)}: "
            "tag the notebook's last code cell",
            file=sys.stderr,
        )
        return 2
    failed = []
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        for path, ok, msg in pool.map(one, paths):
            print(
                f"{path.relative_to(ROOT)}: {msg}"
                if ok
                else f"{path.relative_to(ROOT)}: FAILED, left as it was: {msg}",
                flush=True,
            )
            if not ok:
                failed.append(path)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
