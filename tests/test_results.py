"""Committed results agree with what they claim: each results/NAME/README.md table is what tools/collect_results.py
reads from the eval.json and config.yaml beside it, and the committed quickstart config is the one measured there."""

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from collect_results import row, switches  # noqa: E402


def test_every_results_table_row_is_read_from_its_committed_files():
    names = sorted(p.parent for p in (ROOT / "results").glob("*/README.md"))
    assert names, "no committed results"
    for d in names:
        text = (d / "README.md").read_text()
        runs = sorted(p.parent for p in d.glob("*/eval.json"))
        assert runs, d
        for run in runs:
            r = row(run)
            line = next((ln for ln in text.splitlines() if ln.startswith(f"| {run.name} |")), None)
            assert line is not None, f"{d.name}/README.md has no row for {run.name}"
            for col in ("held-out 1", "gap 1", "SSIM 1", "theme agr.", "lighting agr."):
                assert f"| {r[col]} |" in line, (
                    f"{d.name}/{run.name}: {col} is {r[col]} in eval.json"
                )


def test_the_committed_quickstart_is_the_measured_one():
    now = yaml.safe_load((ROOT / "sweeps" / "exp" / "quickstart.yaml").read_text())
    ran = yaml.safe_load((ROOT / "results" / "texture" / "quickstart" / "config.yaml").read_text())
    assert switches(now) == switches(ran)
