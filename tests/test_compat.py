"""What was written before a change still works after it: a dataset and a run checkpoint made by the
code at fbaef71 (tests/golden/compat: `qmind data gen ... data.dataset=ds-compat data.episodes=2
data.frames_per_episode=8` and `qmind train ... name=compat train.steps=2 train.batch=2
train.warmup=1 train.sample_every=0 train.keep_last=1`) are fetched, verified, resumed, and
evaluated to the numbers the code gave before the change (tests/test_checkpoint.py pins its
samples)."""

import shutil
from pathlib import Path

import pytest
import torch

from qmind_render.core.config import config_from_dict
from qmind_render.data.cache import fetch, verify_dataset
from qmind_render.data.stores import open_store
from qmind_render.core.checkpoint import checkpoints, load_checkpoint
from qmind_render.core.evaluate import eval_indices, gather, load_for_eval, render_frames
from qmind_render.core.metrics import as_float, psnr
from qmind_render.core.train import train

GOLDEN = Path(__file__).parent / "golden" / "compat"


def test_a_dataset_and_checkpoint_from_before_still_load_and_resume(tmp_path, monkeypatch):
    shutil.copytree(GOLDEN, tmp_path / "compat")
    monkeypatch.setenv("QMIND_CACHE", str(tmp_path / "cache"))
    store = open_store(str(tmp_path / "compat" / "store"))
    assert verify_dataset(store, "ds-compat") == []
    ds = fetch(store, "ds-compat")
    assert ds.manifest.n_samples == 16
    run = tmp_path / "compat" / "runs" / "compat"
    old = load_checkpoint(checkpoints(run)[-1])
    assert old["step"] == 2 and old["dataset"] == "ds-compat"
    # the run's own config (from before today's defaults), one step longer
    cfg = config_from_dict(
        old["config"], [f"data.store={tmp_path / 'compat' / 'store'}", "train.steps=3"]
    )
    res = train(cfg, tmp_path / "compat" / "runs", progress=False)
    assert res["status"] == "finished" and res["step"] == 3
    new = load_checkpoint(checkpoints(run)[-1])
    # it trained on from there
    assert any(not torch.equal(new["model"][k], old["model"][k]) for k in old["model"])


# Evaluation of the compat run (one frame per cell, 1 DDIM step, on the CPU), by the code at
# 06038d7: per part, the frames, their mean PSNR (dB) against the ground truth and the sum of the
# rendered uint8 pixels.
COMPAT_EVAL = {
    "heldout": (2, 12.173430442810059, 3087897),
    "train": (14, 9.134058952331543, 21615205),
}


def test_the_run_from_before_evaluates_to_the_same_numbers(tmp_path, monkeypatch):
    shutil.copytree(GOLDEN, tmp_path / "compat")
    monkeypatch.setenv("QMIND_CACHE", str(tmp_path / "cache"))
    ld = load_for_eval(
        tmp_path / "compat" / "runs" / "compat",
        [f"data.store={tmp_path / 'compat' / 'store'}"],
        "cpu",
    )
    assert (ld.step, ld.ds.id, ld.split.name) == (2, "ds-compat", "random_15")
    sampler = ld.sampler()
    for part, (n, want_psnr, want_sum) in COMPAT_EVAL.items():
        b = gather(ld.ds, eval_indices(ld.ds, ld.split, part, 1))
        frames = render_frames(sampler, b, 1)
        got = psnr(as_float(frames), as_float(b["rgb"])).mean().item()
        assert len(frames) == n and got == pytest.approx(want_psnr, abs=1e-3), (part, got)
        assert int(frames.sum()) == pytest.approx(want_sum, rel=1e-5), part
