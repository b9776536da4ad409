"""Commit a finished sweep as results: the sweep file, each run's eval.json, config.yaml and timing
under results/NAME/runs/RUN/, the sweep report (report.md, psnr.png, results.json) made from those
copies, and a README.md with the commit, the command and the CPU time the runs took.

    python tools/collect_sweep.py sweeps/coverage.yaml results/coverage --command "qmind sweep ..."

`report_from_results` remakes the report from the committed files alone; tests/test_results.py
checks that it gives the committed results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from datetime import datetime
from pathlib import Path

from qmind_render.data.dataset import git_commit
from qmind_render.core.eval_result import EvalResult
from qmind_render.sweeps.sweep import expand_sweep, load_sweep, read_json, run_finished, write_json
from qmind_render.sweeps.sweep_report import write_report
from qmind_render.util import atomic_write, cpu_name


def run_timing(run_dir: Path) -> dict:
    """A run's start, end and wall seconds: papermill's record in the executed notebook, else the
    job record's."""
    nb = next(run_dir.glob("*.ipynb"), None)
    pm = json.loads(nb.read_text())["metadata"].get("papermill", {}) if nb else {}
    if pm.get("start_time") and pm.get("end_time"):
        start = datetime.fromisoformat(pm["start_time"]).timestamp()
        end = datetime.fromisoformat(pm["end_time"]).timestamp()
        return {"started": start, "finished": end, "wall_s": round(end - start, 1)}
    job = read_json(run_dir / "job.json") or {}
    if "started" in job and "finished" in job:
        return {
            "started": job["started"],
            "finished": job["finished"],
            "wall_s": round(job["finished"] - job["started"], 1),
        }
    raise SystemExit(f"{run_dir}: no start and end time (executed notebook or job.json)")


def run_commit(run_dir: Path) -> str:
    "The commit a run trained at, from its final checkpoint (`+dirty`: with uncommitted changes)."
    import torch

    ck = Path(EvalResult.of_run(run_dir).checkpoint)
    ck = ck if ck.is_file() else run_dir / "checkpoints" / ck.name
    return torch.load(ck, weights_only=True, map_location="cpu")["git"]


def report_from_results(
    dest: Path, out: Path | None = None, sweep_root: Path | None = None
) -> dict:
    "The sweep report remade from what results/NAME holds (its sweep.yaml and runs/)."
    return write_report(dest / "sweep.yaml", out or dest, root=dest / "runs", sweep_root=sweep_root)


def collect(sweep: Path, dest: Path, runs_dir: Path, command: str) -> dict:
    "Copy the finished runs of `sweep` from `runs_dir` into `dest` and write its report and README."
    s = load_sweep(sweep)
    runs = expand_sweep(sweep)
    missing = [
        r.name for r in runs if not run_finished(runs_dir / r.name, r.config["train"]["steps"])
    ]
    if missing:
        raise SystemExit(
            f"{sweep}: {len(missing)} run(s) not finished ({missing[0]}, ...): run the sweep first"
        )
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(sweep, dest / "sweep.yaml")
    timings = {}
    for r in runs:
        src, d = runs_dir / r.name, dest / "runs" / r.name
        (d / "eval").mkdir(parents=True, exist_ok=True)
        shutil.copy(src / "eval" / "eval.json", d / "eval" / "eval.json")
        # `qmind themes RUN [--themes validation]`: its figures on new themes, where measured
        for f in sorted((src / "eval").glob("new_themes*.json")):
            shutil.copy(f, d / "eval" / f.name)
        shutil.copy(src / "config.yaml", d / "config.yaml")
        timings[r.name] = run_timing(src) | {"git": run_commit(src)}
        write_json(d / "timing.json", timings[r.name])
    rep = report_from_results(dest)
    walls = [t["wall_s"] for t in timings.values()]
    span = max(t["finished"] for t in timings.values()) - min(
        t["started"] for t in timings.values()
    )
    text = (
        f"# Sweep {s['name']}: committed results\n\n"
        "Run at commit "
        f"{', '.join(f'`{c}`' for c in sorted({t['git'] for t in timings.values()}))} "
        "with "
        f"`{command}` on {os.cpu_count()} cores of {cpu_name()}; collected at commit "
        f"`{git_commit()}`.\n"
        f"{len(runs)} runs took {sum(walls) / 60:.1f} CPU-run minutes in all (median "
        f"{sorted(walls)[len(walls) // 2] / 60:.1f} "
        f"a run) and "
        f"{span / 60:.1f} minutes of wall time from the first start to the last finish.\n\n"
        "`runs/` holds each run's eval.json (and new_themes.json where `qmind themes RUN` "
        "measured it), config.yaml and timing.json; report.md, psnr.png and "
        "results.json are made from them by `tools/collect_sweep.py` (the function "
        "`report_from_results`).\n"
    )
    atomic_write(dest / "README.md", text)
    return rep


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--runs", type=Path, default=Path("runs"))
    p.add_argument("--command", default="")
    a = p.parse_args(argv)
    rep = collect(a.sweep, a.dest, a.runs, a.command)
    print(
        f"{a.dest}: {len(rep['rows'])} runs, report.md, psnr.png, results.json and "
        "README.md written"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
