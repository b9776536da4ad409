"""Commit a set of finished runs as results: each run's eval.json and config.yaml under
results/NAME/RUN/, and a README.md whose table is read from those files (no number typed by hand).

    python tools/collect_results.py texture runs/q1 runs/q3 \
        --note "what the runs compare" --command "qmind run ..."
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import yaml
from qmind_render.config import config_from_dict, config_to_dict
from qmind_render.data import git_commit
from qmind_render.util import atomic_write, format_table

SWITCHES = (
    "data.holdout",
    "model.uv_freqs",
    "model.depth_freqs",
    "model.pixel_head",
    "model.lit_head",
    "model.theme_enc",
    "train.batch",
    "train.steps",
    "train.loss",
    "train.sampler_share",
    "train.finetune_steps",
)


def switches(config: dict) -> dict:
    """The switches a run's config sets, keys added since it ran taking their defaults (as a
    checkpoint's do)."""
    sw = config_to_dict(config_from_dict(config))
    return {k: sw[k.split(".")[0]][k.split(".")[1]] for k in SWITCHES}


def row(run: Path) -> dict:
    "One table row from a run's committed eval.json and config.yaml."
    ev = json.loads((run / "eval.json").read_text())
    sw = switches(yaml.safe_load((run / "config.yaml").read_text()))
    h, t = ev["parts"]["heldout"], ev["parts"]["train"]
    seed = config_from_dict(yaml.safe_load((run / "config.yaml").read_text())).seed
    out = {"run": run.name, "seed": seed, **{k.split(".")[1]: v for k, v in sw.items()}}
    # what both parts were scored on: unseen walks, the same frames in every cell (57_walks), or,
    # before that, the dataset's frames (training cells on the frames they trained on)
    out["frames"] = ev.get("frames", "dataset")
    for k in ev["ddim_steps"]:
        out[f"held-out {k}"] = f"{h[f'ddim_{k}']['psnr']:.2f}"
    k = ev["ddim_steps"][0]
    out[f"train {k}"] = f"{t[f'ddim_{k}']['psnr']:.2f}"
    out[f"gap {k}"] = f"{t[f'ddim_{k}']['psnr'] - h[f'ddim_{k}']['psnr']:.2f}"
    m = ev.get("gap_matched", {}).get(f"ddim_{k}")
    out[f"matched gap {k}"] = f"{m['gap']:.2f} ± {m['se']:.2f}" if m else "–"
    out[f"SSIM {k}"] = f"{h[f'ddim_{k}']['ssim']:.3f}"
    gt = h["ground_truth_classifier"]
    for f in ("theme", "lighting"):
        out[f"{f} agr."] = f"{h[f'ddim_{k}']['classifier'][f] / gt[f]:.2f}"
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("name")
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--note", default="")
    p.add_argument("--command", default="")
    a = p.parse_args(argv)
    dest = Path("results") / a.name
    for run in a.runs:
        d = dest / run.name
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(run / "eval" / "eval.json", d / "eval.json")
        shutil.copy(run / "config.yaml", d / "config.yaml")
    commit = git_commit()
    rows = [row(dest / run.name) for run in a.runs]
    first = json.loads((dest / a.runs[0].name / "eval.json").read_text())
    base = first["parts"]["heldout"]["baseline"]
    text = (
        f"# {a.name}\n\n{a.note}\n\nCollected at commit `{commit}`; made with "
        f"`{a.command}`; each run's eval.json and "
        "config.yaml are beside this file, and this table is read from them by "
        "`tools/collect_results.py`.\n"
        "PSNR in dB on frames of held-out and training cells (`frames`: `walks`, unseen walks, the "
        "same frames in every cell; `dataset`, the dataset's frames, training cells on frames they "
        "trained on); the mean-colour baseline scores "
        f"{base['psnr']:.2f} dB and SSIM {base['ssim']:.3f} "
        f"held-out.\n\n{format_table(rows, markdown=True)}\n"
    )
    atomic_write(dest / "README.md", text)
    print(f"results/{a.name}: {len(rows)} runs, README.md written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
