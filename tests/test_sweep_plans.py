"""A sweep's dry run: step times measured once per machine and recipe and stored, so two dry runs
price a sweep alike; the Slurm and cloud dry runs show their time and what they would submit; the
instance table says what its "-" cells mean (issue 54 item 6)."""

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

import qmind_render.sweeps.cost as cost
from qmind_render.sweeps.sweep_cli import sweep_main

REPO = Path(__file__).resolve().parents[1]
SWEEP = ["quickstart", "-m", "seed=1,2", "--dry-run"]


@pytest.fixture
def plans(tmp_path, monkeypatch):
    """Dry runs in the repository with their own cache and runs folder; the measurements are
    stand-ins that differ each time they run (as a step time on a busy machine does) and count
    their calls."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("QMIND_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("QMIND_RUNS", str(tmp_path / "runs"))
    calls = {"step": 0, "model": 0}

    def step_seconds(cfg, threads=None, **kw):
        calls["step"] += 1
        return 0.2 * calls["step"]

    def measure_model(model_cfg, n=2):
        calls["model"] += 1
        return {
            "params": 1_000_000 * calls["model"],
            "forward_flops": 1e9 * calls["model"],
            "train_forward_ratio": 3.0,
            "activation_bytes_per_sample": 1e6,
        }

    monkeypatch.setattr(cost, "step_seconds", step_seconds)
    monkeypatch.setattr(cost, "measure_model", measure_model)
    return calls


def _dry_run(argv: list[str], monkeypatch) -> str:
    "stdout of `qmind sweep ARGV` as a fresh process sees it (nothing remembered in memory)."
    monkeypatch.setattr(cost, "_MEASURED", {})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert sweep_main(argv) == 0
    return out.getvalue()


def _wall(out: str) -> str:
    return re.search(r"wall time on the \w+ backend: about (\S+ ?s|\S+) for the sweep", out)[1]


def test_two_dry_runs_price_a_sweep_alike_and_the_second_measures_nothing(plans, monkeypatch):
    first = _dry_run(SWEEP, monkeypatch)
    store = cost.store_path()
    stamp = store.stat().st_mtime_ns
    assert plans == {"step": 1, "model": 1}  # one recipe: measured once for the two runs
    assert "measured now" in first
    second = _dry_run(SWEEP, monkeypatch)
    assert plans == {"step": 1, "model": 1}  # read, not measured
    assert store.stat().st_mtime_ns == stamp
    assert re.search(
        r"\(stored \d{4}-\d\d-\d\d at load [\d.]+ on \d+ CPUs; "
        r"`qmind bench steps` measures again\)",
        second,
    )
    # the same figures; only where they came from differs
    assert _wall(first) == _wall(second) != "0m00s"
    strip = lambda s: s.split("wall time")[0]  # noqa: E731
    assert strip(first) == strip(second)


def test_a_stored_figure_is_per_machine_and_recipe(plans, monkeypatch):
    _dry_run(SWEEP, monkeypatch)
    _dry_run([*SWEEP, "model.patch=1"], monkeypatch)  # another model: measured
    assert plans == {"step": 2, "model": 2}
    _dry_run([*SWEEP, "--jobs", "2"], monkeypatch)  # another thread count: its step time
    assert plans == {"step": 3, "model": 2}
    here = cost.machine_key()
    other = here | {"torch": "0.0"}
    monkeypatch.setattr(cost, "machine_key", lambda: other)  # another machine: both
    _dry_run(SWEEP, monkeypatch)
    assert plans == {"step": 4, "model": 3}
    entries = json.loads(cost.store_path().read_text()).values()
    assert {e["machine"]["torch"] for e in entries} == {"0.0", here["torch"]}


def test_bench_steps_and_remeasure_refresh_the_stored_figure(plans, monkeypatch):
    before = _wall(_dry_run(SWEEP, monkeypatch))
    res = cost.bench_steps("quickstart", threads=cost.os.cpu_count())
    assert plans == {"step": 2, "model": 2} and res["step_s"] == pytest.approx(0.4)
    assert res["stored_in"] == str(cost.store_path())
    after = _dry_run(SWEEP, monkeypatch)
    assert plans == {"step": 2, "model": 2} and "stored " in after
    assert _wall(after) != before  # the new figure, read back
    again = _dry_run([*SWEEP, "--remeasure"], monkeypatch)
    assert plans == {"step": 3, "model": 2} and "measured now" in again


def test_the_slurm_dry_run_shows_its_time_and_the_script_it_would_submit(plans, monkeypatch):
    out = _dry_run([*SWEEP, "--backend", "slurm", "--gpus", "1"], monkeypatch)
    wall = _wall(out)
    assert wall != "0m00s" and float(wall.split()[0]) > 0, wall
    assert "the array job it would submit (sbatch):" in out
    script = out.split("(sbatch):")[1]
    assert script.lstrip().startswith("#!/bin/bash")
    for line in ("#SBATCH --array=0-1", "#SBATCH --gres=gpu:1", "-m papermill"):
        assert line in script
    # written nowhere
    assert not (Path(cost.os.environ["QMIND_RUNS"]) / "slurm").exists()


def test_the_ec2_dry_run_shows_its_time_and_the_jobs_it_would_launch(plans, monkeypatch):
    out = _dry_run([*SWEEP, "--backend", "ec2", "data.store=s3://bucket/qmind"], monkeypatch)
    assert float(_wall(out).split()[0]) > 0
    assert out.count("DRY RUN: nothing created, no AWS call made.") == 2
    assert "would create  instance type=g6.xlarge market=spot" in out
    assert "run dir       s3://bucket/qmind/runs/quickstart-001-seed2" in out
    # a store a cloud job cannot read: what it would refuse, and how to fix it
    local = _dry_run([*SWEEP, "--backend", "ec2"], monkeypatch)
    assert local.count("would be refused:") == 2 and "set data.store=s3://" in local


def test_the_instance_table_says_what_a_dash_means(plans, monkeypatch):
    out = _dry_run(SWEEP, monkeypatch)
    table = out.split("total estimate")[1].split("wall time")[0]
    assert " - " in table
    assert '"-" in the table:' in table
    assert "  hours: " + cost.MISSING["hours"] in table
    assert "  usd_spot: " + cost.MISSING["usd_spot"] in table
    # and `qmind cost`'s table
    plan = cost.format_plan(cost.plan_cost(cost.checked_config("quickstart", [])))
    assert '"-" in the table:' in plan and "runs_in_budget: no --budget given" in plan
