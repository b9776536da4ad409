"""The results chapter's picture of themes held out whole: for each held-out theme (a fold of
sweeps/themes_out.yaml), a test frame's truth, what each arm's model rendered, and the same frame
painted with the nearest training theme (by parameter vector, among the grid's other four).

    python tools/theme_pictures.py runs results/themes_out/heldout_themes.png

Needs the sweep's run dirs (checkpoints are not committed); the chapter shows the PNG it writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from qmind_render.core.evaluate import eval_indices, gather, load_for_eval, render_frames
from qmind_render.util import save_figure
from qmind_render.viz import grid_figure, mosaic
from qmind_render.world.grid import load_grid
from qmind_render.world.skinner import SURFACES, skin
from qmind_render.world.themes import nearest_theme

ARMS = ("planes", "vector", "planes_random", "vector_random")
CHANNELS = ("depth", "surface", "material", "uv", "light")


def run_of(runs: Path, arm: str, theme: int, seed: int = 1) -> Path | None:
    "The run dir of `arm` holding out theme `theme` at `seed`, if it has a checkpoint."
    hits = sorted(runs.glob(f"themes_out-*-{arm}-theme_{theme}-seed{seed}"))
    return hits[0] if hits and any((hits[0] / "checkpoints").glob("*.pt")) else None


def frame_of(ld, n: int = 1) -> dict:
    "The first test frame of the held-out theme showing most wall, as a batch of one."
    idx = eval_indices(ld.ds, ld.split, "test", 4)
    b = gather(ld.ds, idx)
    walls = (b["surface"] == SURFACES.index("wall")).flatten(1).sum(1)
    pick = torch.argsort(walls, descending=True)[:n]
    return {k: v[pick] for k, v in b.items()}


def main(runs: str = "runs", out: str = "results/themes_out/heldout_themes.png") -> int:
    runs, grid = Path(runs), load_grid()
    rows, names = [], []
    for t in range(grid.shape[0]):
        base = run_of(runs, "planes", t)
        if base is None:
            continue
        ld = load_for_eval(base)
        b = frame_of(ld)
        row = [b["rgb"][0].numpy()]
        for arm in ARMS:
            r = run_of(runs, arm, t)
            if r is None:
                row.append(np.zeros_like(row[0]))
                continue
            lr = load_for_eval(r)
            row.append(render_frames(lr.sampler(1), b, 1)[0].cpu().numpy())
        others = [x for i, x in enumerate(grid.themes) if i != t]
        j, _ = nearest_theme(grid.themes[t], others)
        ch = {k: b[k].numpy() for k in CHANNELS}
        row.append(skin(ch, others[j], grid.lightings[int(b["lighting"][0])])[0])
        rows.append(row)
        names.append(f"{grid.theme_names[t]} (nearest: {others[j]['name']})")
    if not rows:
        print(f"no themes_out runs with checkpoints under {runs}", file=sys.stderr)
        return 1
    cols = ["truth", "planes", "vector", "planes+random", "vector+random", "nearest theme"]
    fig = grid_figure(mosaic(rows), names, cols, size=1.1)
    path = save_figure(fig, out, dpi=80)
    print(f"wrote {path}: {len(rows)} held-out themes x {len(cols)} columns")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
