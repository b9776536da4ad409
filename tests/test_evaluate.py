"""Evaluation and the main job: `qmind run` end to end on a small config (real subprocess), its
rerun, the errors the issue names, and the factor classifiers' sanity (chance on shuffled labels).

One run is made as a user makes it (a subprocess); the rest call `qmind_render.cli.main` here (a
process costs seconds of imports), and the evaluation's temporal walks are fewer and shorter than
the main job's (what they check does not depend on how many)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qmind_render.data.splits import load_split
from qmind_render.core.eval_result import SCHEMA, EvalResult
from qmind_render.core.evaluate import EvalError, evaluate, load_for_eval

CLI = [sys.executable, "-c", "import sys; from qmind_render.cli import main; sys.exit(main())"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval")
    (tmp / "sweeps").mkdir()
    (tmp / "sweeps" / "splits").symlink_to(ROOT / "sweeps" / "splits")
    return tmp


def small(work, name="small", *extra):
    return [
        f"data.store={work}/store",
        "data.dataset=ds-e",
        "data.episodes=24",
        "data.frames_per_episode=20",
        f"name={name}",
        "train.batch=8",
        "train.steps=20",
        "train.warmup=5",
        "train.log_every=10",
        "train.sample_every=0",
        "tracker=none",
        "train.lr=2e-3",
        "eval.ddim_steps=[1,2]",
        "eval.frames_per_cell=2",
        "eval.classifier_steps=30",
        "eval.temporal_walks=3",
        "eval.temporal_frames=8",
        # a diffusion model, scored at 1 and 2 steps (the main job's regressor is one pass)
        "model.regression=false",
        *extra,
    ]


def env(work):
    return {**os.environ, "QMIND_CACHE": str(work / "cache"), "QMIND_RUNS": str(work / "runs")}


def qmind_run(work, args: list[str], timeout: int = 600):
    "`qmind run ARGS` in `work` as a user runs it (a subprocess); its completed process, checked."
    r = subprocess.run(
        CLI + ["run", *args],
        cwd=work,
        env=env(work),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def ran(work):
    return qmind_run(work, small(work))


def test_run_end_to_end_writes_the_report(work, ran):
    out = ran.stdout
    assert (
        "[1/3] dataset ds-e: not in" in out
        and "[2/3] training small" in out
        and "[3/3] evaluating" in out
    )
    ev = work / "runs" / "small" / "eval"
    # the file records its schema and its headline step count, chosen on the validation cells
    raw = json.loads((ev / "eval.json").read_text())
    res = EvalResult.read(ev / "eval.json")
    k = res.headline_steps
    assert (raw["schema"], raw["headline_steps"], res.steps) == (SCHEMA, k, [1, 2])
    assert (raw["headline_from"], res.held) == ("validation", "test")
    val = {j: res.parts["validation"].psnr(j) for j in res.steps}
    assert val[k] == max(val.values())
    assert f"PSNR test/training cells {res.headline_psnr('heldout'):.2f}/" in out
    # three parts on unseen walks: every cell of the split (balanced_20: 20 of the 100 held out,
    # 10 validation and 10 test), the same 2 frames in each
    assert res.frames == "walks"
    assert res.split_cells["test"] == [list(c) for c in load_split("balanced_20").test]
    got = {p: (r.cells, r.frames) for p, r in res.parts.items()}
    assert got == {"train": (80, 160), "validation": (10, 20), "test": (10, 20)}
    for part in ("test", "validation", "train"):
        r = res.parts[part]
        assert r.baseline and r.baseline_additive and set(r.at) == {1, 2}
        assert 0 < r.psnr(2) < 100 and 0 <= r.at[2]["ssim"] <= 1
        assert set(r.at[2]["mae_by_surface"]) == {"ceiling", "wall", "floor", "enemy"}
        for m in ("psnr", "psnr_walls", "texture", "texture_walls"):
            lo, hi = r.at[2]["ci"][m]
            assert lo <= r.at[2][m] <= hi, (part, m)
        # the classifiers' accuracy on true frames, beside the model's, with intervals
        gt = r.ground_truth_classifier
        assert set(gt) == {"theme", "lighting", "material", "ci"} and 0 <= gt["material"] <= 1
        assert set(r.at[2]["classifier"]["ci"]) == {"theme", "lighting", "material"}
    # the additive baseline knows what the training cells show: it beats the flat one
    assert res.parts["test"].baseline_additive["psnr"] > res.parts["test"].baseline["psnr"] + 3
    for part in ("test", "train"):
        # the temporal figure: the model's change against the truth's (tOF form), and the old
        # warping error with its excess
        t = res.parts[part].temporal
        assert t.walks == 3 and t.frames == 8 and 0.3 < t.coverage < 1
        assert 0 < t.ground_truth < 60 and t.at[2]["rms"] > 0
        assert abs(t.at[2]["excess"] - (t.at[2]["rms"] - t.ground_truth)) < 1e-9
        d = t.at[2]
        assert (
            d["difference"] > 0
            and d["difference_ci"][0] <= d["difference"] <= d["difference_ci"][1]
        )
    assert res.parts["validation"].temporal is None
    # by novelty: balanced_20's test cells all have every pair seen
    assert set(res.by_novelty[k]) == {"0"} and res.by_novelty[k]["0"]["cells"] == 10
    # the per-frame figures of every cell, for bootstraps across runs
    assert len(res.per_frame[k]["psnr"]) == 100 and len(res.per_frame[k]["psnr"][0]) == 2
    assert res.temporal_seconds > 0
    # where the steps go wrong (52_steps), on validation frames: the estimate from the truth noised
    # to each visited timestep and along each sampler's path; a path's last estimate is its frame
    st = res.timesteps
    assert (st["part"], st["frames"]) == ("validation", 20)
    assert set(st["noised"]) == {"999", "499"} and set(st["sampled"]) == {"1", "2"}
    assert list(st["sampled"]["2"]) == ["999", "499"]
    assert st["final"]["1"] == st["sampled"]["1"]["999"] == st["sampled"]["2"]["999"]
    assert st["final"]["2"] == st["sampled"]["2"]["499"] and 5 < st["final"]["2"] < 60
    # recall, at the headline: frames it trained on against as many new ones of the same kind
    a, b = res.seen["trained"], res.seen["unseen"]
    assert a.frames > 0 and b.frames > 0 and 0 < a.psnr(k) < 100
    assert res.memorised == {k: pytest.approx(a.psnr(k) - b.psnr(k))}
    assert res.lpips.startswith(("computed", "unavailable"))
    assert set(res.gap) == {1, 2}
    # the matched gap: an additive fit over the training cells, each held-out cell against it
    m = res.gap_matched[k]
    assert m["cells"] == 10 and m["se"] > 0 and abs(m["gap"]) < 30
    lo, hi = m["ci"]
    # the interval carries the fit's error: wider than the leave-one-out ± 1.96 se
    assert lo < m["gap"] < hi and hi - lo > 2 * 1.96 * m["se"]
    report = (ev / "report.md").read_text()
    assert f"{m['gap']:.2f} [{lo:.2f}, {hi:.2f}]" in report
    assert "2 frames of unseen walks, the same in every cell" in report
    assert f"the best PSNR on the validation cells: {k}." in report
    assert f"{res.memorised[k]:+.2f} dB remembered rather than rendered" in report
    # the gap by factor level, at the headline: every scored cell counted once per factor, and
    # the held-out cells' mean over one factor's levels agrees with the matched gap's cell gap
    by = res.gap_by_level[k]
    assert [r["level"] for r in by["lighting"]] == ["daylight", "torchlight", "moonlight", "toxic"]
    for rows in by.values():
        assert sum(r["heldout_cells"] for r in rows) == m["cells"]
    rows = [r for r in by["theme"] if r["heldout"] is not None]
    held_mean = sum(r["heldout"] * r["heldout_cells"] for r in rows) / m["cells"]
    train = [r for r in by["theme"] if r["train"] is not None]
    train_mean = sum(r["train"] * r["train_cells"] for r in train) / sum(
        r["train_cells"] for r in train
    )
    assert abs((train_mean - held_mean) - m["cell_gap"]) < 1e-6
    assert f"### The gap by factor level ({k} DDIM step{'s' * (k > 1)}; means over cells)" in report
    assert "| lighting | daylight |" in report
    assert (
        "mean-colour baseline" in report
        and "Test cells (held out, reported)" in report
        and "additive baseline" in report
        and "![PSNR per cell](psnr_heatmap.png)" in report
    )
    assert "## Temporal stability" in report and "![temporal](temporal.png)" in report
    for f in (
        "psnr_heatmap.png",
        "samples_heldout.png",
        "samples_train.png",
        "episode.gif",
        "temporal.png",
    ):
        assert (ev / f).stat().st_size > 1000, f
    from PIL import Image

    assert Image.open(ev / "episode.gif").n_frames == 24


def in_work(work, monkeypatch):
    "Run `qmind_render.cli.main` here as `qmind` runs in `work`: its folder and environment."
    monkeypatch.chdir(work)
    for k, v in env(work).items():
        monkeypatch.setenv(k, v)


def test_rerun_reuses_everything(work, ran, capsys, monkeypatch):
    from qmind_render.cli import main

    in_work(work, monkeypatch)
    assert main(["run", *small(work)]) == 0
    out = capsys.readouterr().out
    assert "reusing it" in out and "finished earlier" in out and "done earlier" in out, out


def test_eval_is_reproducible(work, ran):
    a = EvalResult.read(work / "runs" / "small" / "eval" / "eval.json")
    b = evaluate(
        work / "runs" / "small",
        [a for a in small(work) if a.startswith("eval.")],
        out=work / "again",
        log=lambda *_: None,
    )
    assert a.part("heldout").psnr(2) == b.part("heldout").psnr(2)
    assert a.per_frame == b.per_frame and a.gap_matched == b.gap_matched
    assert a.headline_steps == b.headline_steps


def test_eval_errors(work, ran, tmp_path):
    (tmp_path / "empty-run").mkdir()
    with pytest.raises(EvalError, match="has no checkpoint"):
        load_for_eval(tmp_path / "empty-run")
    with pytest.raises(EvalError, match="no such run dir or checkpoint"):
        load_for_eval(tmp_path / "nope")
    with pytest.raises(EvalError, match=r"trained on dataset ds-e.*not in store"):
        load_for_eval(work / "runs" / "small", [f"data.store={tmp_path}/other-store"])
    other = tmp_path / "grid.yaml"
    other.write_text(
        "name: g\nversion: 1\nseed: 0\ngrid: {theme: 3, material: 5, light: "
        "4}\nheld_out: [[0, 0, 0]]\n"
    )
    with pytest.raises(EvalError, match=r"split g is for grid .*ds-e"):
        load_for_eval(work / "runs" / "small", [f"data.holdout={other}"])


def test_eval_cli_without_checkpoint_is_one_line(work, tmp_path, capsys, monkeypatch):
    from qmind_render.cli import main

    (tmp_path / "r").mkdir()
    in_work(work, monkeypatch)
    assert main(["eval", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no checkpoint" in err and "Traceback" not in err, err


def test_a_device_the_machine_lacks_is_one_line(work, ran, capsys, monkeypatch):
    from qmind_render.cli import main

    if torch.mps.is_available():
        pytest.skip("this machine has MPS")
    monkeypatch.setenv("QMIND_CACHE", str(work / "cache"))
    assert main(["eval", str(work / "runs" / "small"), "eval.device=mps"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "qmind eval: error: eval.device=mps, but this machine has no MPS device" in err
    ), err


def test_an_encoding_or_objective_the_checkpoint_was_not_trained_with_is_refused_by_name(
    work, ran, capsys, monkeypatch
):
    """An override of the model section (an encoding, the objective) on eval: one line naming the
    key and both values, exit 2."""
    from qmind_render.cli import main

    monkeypatch.setenv("QMIND_CACHE", str(work / "cache"))
    # the run trained the defaults' (the main job's) encodings and objective
    for override, said in [
        ("model.uv_freqs=[1,2,4]", "model.uv_freqs=[1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, 32], not"),
        ("model.prediction=eps", "model.prediction='v', not 'eps'"),
        ("model.theme_enc=param_vector", "model.theme_enc='planes', not 'param_vector'"),
    ]:
        assert main(["eval", str(work / "runs" / "small"), override]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err and "drop the " in err, err


def test_a_corrupt_checkpoint_is_one_line_with_evals_own_advice(work, ran, tmp_path, capsys):
    """A run whose latest checkpoint is corrupt: one line, exit 2, naming the file `qmind eval` can
    take instead (not train.resume)."""
    import shutil

    from qmind_render.cli import main

    run = tmp_path / "r4" / "checkpoints"
    run.mkdir(parents=True)
    shutil.copy(work / "runs" / "small" / "checkpoints" / "0000020.pt", run / "0000020.pt")
    (run / "0000030.pt").write_bytes((run / "0000020.pt").read_bytes()[:5000])
    assert main(["eval", str(run.parent)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "0000030.pt is not a readable checkpoint" in err, err
    assert (
        f"other checkpoints: 0000020.pt (evaluate it with qmind eval {run / '0000020.pt'})" in err
        and "train.resume" not in err
    ), err


def test_the_regression_control_never_sees_a_frame_and_is_scored_once(
    work, ran, capsys, monkeypatch
):
    """`model.regression=true` (issue 44's control): the same network, trained on the channels
    alone. Its first convolution's weights on the frame input never move from their initial values
    (that input is zeros), the rest do, and evaluation scores it in one pass. (Its evaluation
    leaves out the temporal walks and fits the classifiers briefly: none of that is asserted.)"""
    from qmind_render.cli import main
    from qmind_render.core.checkpoint import load_checkpoint
    from qmind_render.core.config import load_config
    from qmind_render.core.model import build_model
    from qmind_render.world.grid import load_grid

    in_work(work, monkeypatch)
    cheap = ["eval.temporal_walks=0", "eval.classifier_steps=5", "eval.frames_per_cell=1"]
    assert main(["run", *small(work, "reg", "model.regression=true", "train.steps=6", *cheap)]) == 0
    out = capsys.readouterr().out
    ck = load_checkpoint(work / "runs" / "reg" / "checkpoints" / "0000006.pt")
    torch.manual_seed(0)
    init = build_model(load_config(None, ["model.regression=true"]).model, grid=load_grid())
    w0, w = init.net.conv_in.weight.detach(), ck["model"]["net.conv_in.weight"]
    assert torch.equal(w[:, :3], w0[:, :3]) and not torch.equal(w[:, 3:], w0[:, 3:])
    res = EvalResult.read(work / "runs" / "reg" / "eval" / "eval.json")
    assert res.steps == [1] and res.headline_steps == 1
    assert set(res.timesteps["noised"]) == {"0"} and "at 1 DDIM step" in out


def test_a_split_that_holds_out_cells_the_model_trained_on_is_refused(work, ran):
    # random_15 holds out cells that balanced_20 (what the model trained without) kept in training
    with pytest.raises(EvalError) as e:
        load_for_eval(work / "runs" / "small", ["data.holdout=random_15"])
    msg = str(e.value)
    assert "\n" not in msg and "trained on" in msg and "data.holdout=balanced_20" in msg


def test_the_test_cells_are_reported_by_novelty_level():
    "A split whose test cells mix novelty levels gets a row per level, each over its own cells."
    import numpy as np
    from types import SimpleNamespace

    from qmind_render.core.evaluate import _novelty_table
    from qmind_render.data.splits import make_split, novelty

    split = make_split("novelty2_75")
    nov = novelty(split)
    # a made-up per-frame figure: 30 dB less 2 dB per unseen pair
    m = np.repeat((30.0 - 2 * np.maximum(nov, 0))[:, None], 4, 1)
    mats = {1: {k: m for k in ("psnr", "psnr_walls", "texture", "texture_walls")}}
    mats["baseline_additive"] = {"psnr": m - 1, "psnr_walls": m - 1}
    by = _novelty_table(SimpleNamespace(split=split), mats, [1], "test")[1]
    levels = sorted(set(nov[split.mask("test")].tolist()))
    assert sorted(by) == [str(v) for v in levels] and "2" in by
    for lv, row in by.items():
        assert row["cells"] == int((split.mask("test") & (nov == int(lv))).sum())
        assert row["psnr"] == 30.0 - 2 * int(lv) and row["baseline_additive"] == row["psnr"] - 1
