"""Sweeps: the cost planner's numbers, sweep expansion, the dry run, and one real local sweep through papermill."""
import json
import math
from pathlib import Path

import pytest

from qmind_render.cloud import Backend, load_menu
from qmind_render.config import load_config
from qmind_render.sweep import (LocalBackend, deck_sizing, expand_sweep, format_table, measure_model, plan_cost,
                                sweep_main)

REPO = Path(__file__).resolve().parents[1]
TINY = ["data.episodes=8", "data.frames_per_episode=16", "data.dataset=ds-sweep-tiny", "train.steps=4", "train.batch=4",
        "train.log_every=1", "train.sample_every=0", "eval.frames_per_cell=1", "eval.ddim_steps=[1]", "tracker=none"]


def test_deck_arithmetic_reproduced():
    rows = deck_sizing()
    assert [r["instance"] for r in rows] == ["g6.xlarge", "g6e.xlarge", "p5.4xlarge"]
    assert all(r["train_flops"] == pytest.approx(3 * 50e9 * 200_000 * 64) for r in rows)
    assert [round(r["hours"]) for r in rows] == [15, 5, 2]          # "L4 ~15 hours, L40S ~5 hours, H100 ~2 hours"
    assert [round(r["usd_on_demand"]) for r in rows] == [12, 9, 12]  # "roughly $12, $9 and $12 per run"
    assert rows[0]["hours"] == pytest.approx(1.92e18 / (121e12 * 0.3) / 3600)


def test_backward_is_about_twice_forward():
    m = measure_model(load_config().model)
    assert 2.5 < m["train_forward_ratio"] < 3.5
    assert m["forward_flops"] > 0 and m["activation_bytes_per_sample"] > 0


def test_plan_numbers_and_budget(monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = load_config("quickstart", ["train.grad_accum=2"])
    p = plan_cost(cfg, budget=100.0, utilisation=0.5)
    assert p["samples"] == cfg.train.steps * cfg.train.batch * 2
    assert p["train_flops"] == pytest.approx(p["train_forward_ratio"] * p["forward_flops"] * p["samples"])
    menu = load_menu()
    rows = {r["instance"]: r for r in p["instances"]}
    assert set(rows) == set(menu)
    l4 = rows["g6.xlarge"]
    assert l4["hours"] == pytest.approx(p["train_flops"] / (121e12 * 0.5) / 3600)
    assert l4["usd_on_demand"] == pytest.approx(l4["hours"] * 0.805)
    assert l4["runs_in_budget"] == math.floor(100.0 / l4["usd_on_demand"])
    assert rows["p5.48xlarge"]["usd_on_demand"] == pytest.approx(rows["p5.48xlarge"]["hours"] * 55.04 / 8)  # one GPU's share
    assert rows["p5.4xlarge"]["usd_spot"] == pytest.approx(rows["p5.4xlarge"]["hours"] * 2.7)
    assert rows["g5.xlarge"]["hours"] is None                    # no bf16 peak in the menu: not guessed
    mem = p["memory_gb"]
    assert mem["adam"] == pytest.approx(2 * mem["weights"]) and mem["ema"] == pytest.approx(mem["weights"])
    assert mem["total"] == pytest.approx(sum(v for k, v in mem.items() if k != "total"))
    with pytest.raises(KeyError, match="not in the menu"):
        plan_cost(cfg, instance="p9.huge")


def test_expand_coverage_and_encoding(monkeypatch):
    monkeypatch.chdir(REPO)
    cov = expand_sweep("sweeps/coverage.yaml")
    assert len(cov) == 9 and len({r.name for r in cov}) == 9
    assert cov[0].name == "coverage-000-coverage_25-seed1" and cov[8].name == "coverage-008-coverage_75-seed3"
    assert {(r.config["data"]["holdout"], r.config["seed"]) for r in cov} == {
        (h, s) for h in ("coverage_25", "coverage_50", "coverage_75") for s in (1, 2, 3)}
    assert all(r.config["name"] == r.name for r in cov)
    enc = expand_sweep("sweeps/encoding.yaml")
    assert {(r.config["model"]["theme_enc"], r.config["model"]["material_enc"]) for r in enc} == {
        (t, m) for t in ("planes", "id", "param_vector") for m in ("one_hot", "embedding")}


def test_dry_run_prints_runs_and_total(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert sweep_main(["sweeps/coverage.yaml", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("9 runs:") and "coverage-004-coverage_50-seed2" in out
    one = plan_cost(load_config("quickstart"))["instances"][0]
    l4 = next(line for line in out.splitlines() if line.startswith("g6.xlarge"))
    assert l4.split()[3:6] == ["9", f"{9 * one['hours']:.3g}", f"{9 * one['usd_on_demand']:.3g}"]


def test_local_sweep_end_to_end(tmp_path, monkeypatch, capsys):
    for k, sub in (("QMIND_STORE", "store"), ("QMIND_RUNS", "runs"), ("QMIND_CACHE", "cache")):
        monkeypatch.setenv(k, str(tmp_path / sub))
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "splits").symlink_to(REPO / "sweeps" / "splits")
    (tmp_path / "nbs").mkdir()
    (tmp_path / "nbs" / "experiments").symlink_to(REPO / "nbs" / "experiments")
    (tmp_path / "sweeps" / "tiny.yaml").write_text(json.dumps(
        {"base": str(REPO / "sweeps" / "exp" / "quickstart.yaml"), "overrides": TINY, "grid": {"seed": [1, 2]}}))
    monkeypatch.chdir(tmp_path)
    assert sweep_main(["sweeps/tiny.yaml", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    names = ["tiny-000-seed1", "tiny-001-seed2"]
    table = out[out.index("run "):].splitlines()
    assert table[0].split() == ["run", "status", "heldout_psnr", "in_dist_psnr", "ddim_steps"]
    for name, line in zip(names, table[1:]):
        rd = tmp_path / "runs" / name
        ev = json.loads((rd / "eval" / "eval.json").read_text())
        h, t = ev["parts"]["heldout"]["ddim_1"]["psnr"], ev["parts"]["train"]["ddim_1"]["psnr"]
        assert line.split() == [name, "done", format_table([{"x": h}]).split()[1], format_table([{"x": t}]).split()[1], "1"]
        assert (rd / "train.ipynb").is_file() and (rd / "params.yaml").is_file()   # the executed copy lands in the run dir
        assert json.loads((rd / "job.json").read_text())["state"] == "done"
    # rerunning skips finished runs
    assert sweep_main(["sweeps/tiny.yaml", "--jobs", "2"]) == 0
    assert capsys.readouterr().out.count("finished earlier, skipped") == 2
    assert isinstance(LocalBackend(), Backend)
