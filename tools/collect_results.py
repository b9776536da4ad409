"""Commit a set of finished runs as results: each run's eval.json and config.yaml under
results/NAME/RUN/, and a README.md whose table is read from those files (`sweep_report.run_row`:
no number typed by hand).

    python tools/collect_results.py texture runs/q1 runs/q3 \
        --note "what the runs compare" --command "qmind run ..."
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from qmind_render.core.eval_result import EvalResult
from qmind_render.data.dataset import git_commit
from qmind_render.sweeps.sweep_report import run_row
from qmind_render.util import atomic_write, format_table


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
        # its figures on new themes (`qmind themes RUN [--themes validation]`), where measured
        for f in sorted((run / "eval").glob("new_themes*.json")):
            shutil.copy(f, d / f.name)
    commit = git_commit()
    # the runs given first, then those committed here before, kept
    given = [run.name for run in a.runs]
    kept = sorted(p.parent.name for p in dest.glob("*/eval.json") if p.parent.name not in given)
    rows = [run_row(dest / name) for name in given + kept]
    base = EvalResult.of_run(dest / a.runs[0].name).part("heldout").baseline
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
