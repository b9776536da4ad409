"""`qmind ship --metrics-from`: a shipped model's figures replaced by an evaluation of that very
file, and an evaluation of anything else refused in one line."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

from qmind_render.core.checkpoint import load_shipped, read_shipped, shipped_path
from qmind_render.core.eval_result import EvalResult

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "import sys; from qmind_render.cli import main; sys.exit(main())"]


def _eval_of(path: Path, tmp: Path, step: int) -> Path:
    "The committed shipped evaluation, as if made of `path` at `step`."
    d = json.loads((ROOT / "results" / "shipped" / "shipped" / "eval.json").read_text())
    out = tmp / f"eval-{step}.json"
    out.write_text(json.dumps(d | {"checkpoint": str(path), "step": step}))
    return out


def test_metrics_from_an_evaluation_of_the_file_replace_its_figures(tmp_path):
    f = tmp_path / "model.pt"
    shutil.copy(shipped_path(), f)
    blob = read_shipped(f)
    # an older figure set, as shipped before validation cells
    blob["metrics"] = {"heldout": {"ddim_1": 1.0, "baseline": 2.0, "frames": 3}}
    from qmind_render.core.checkpoint import save_sealed

    save_sealed(blob, f)
    ev = _eval_of(f, tmp_path, blob["step"])
    r = subprocess.run(
        CLI + ["ship", "--metrics-from", str(ev), "--out", str(f)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    # the committed evaluation's test-cell PSNR at one step, as `ship` rounds it
    want = round(EvalResult.read(ev).part("test").psnr(1), 2)
    assert f"test-cell PSNR {want:.2f}" in r.stdout and want > 30
    _, _, about = load_shipped(f)
    assert about["metrics"]["test"]["ddim_1"] == want
    assert about["metrics"]["headline_from"] == "validation" and len(about["held_out"]) == 20
    # the weights are untouched
    a, b = read_shipped(f)["ema"], read_shipped(shipped_path())["ema"]
    assert all((a[k] == b[k]).all() for k in a)


def test_an_evaluation_of_another_file_or_step_is_refused_in_one_line(tmp_path):
    f = tmp_path / "model.pt"
    shutil.copy(shipped_path(), f)
    before = f.read_bytes()
    for ev in (_eval_of(tmp_path / "other.pt", tmp_path, 11000), _eval_of(f, tmp_path, 7)):
        r = subprocess.run(
            CLI + ["ship", "--metrics-from", str(ev), "--out", str(f)],
            capture_output=True,
            text=True,
        )
        assert r.returncode != 0 and "Traceback" not in r.stderr
        assert r.stderr.count("\n") == 1 and "evaluate it first, qmind eval" in r.stderr
    assert f.read_bytes() == before
    r = subprocess.run(CLI + ["ship"], capture_output=True, text=True)
    assert r.returncode == 2 and "--metrics-from" in r.stderr
