"""Sweeps: the cost planner's numbers, sweep expansion, the dry run, and one real local sweep
through papermill (one run interrupted for real and resumed, reruns skipping finished runs, the
sweep report from its outputs)."""

import contextlib
import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qmind_render.core.eval_result import SCHEMA, EvalResult, Part
from qmind_render.sweeps.cloud import Backend, load_menu
from qmind_render.core.config import MaterialEnc, Prediction, Schedule, ThemeEnc, load_config
from qmind_render.sweeps.cost import deck_sizing, measure_model, plan_cost
from qmind_render.sweeps.sweep import LocalBackend, expand_sweep, load_sweep
from qmind_render.sweeps.sweep_cli import sweep_main
from qmind_render.sweeps.sweep_report import aggregate
from qmind_render.util import format_table

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "data.episodes=8",
    "data.frames_per_episode=16",
    "data.dataset=ds-sweep-tiny",
    "train.steps=8",
    "train.batch=4",
    "train.log_every=1",
    "train.sample_every=0",
    "eval.frames_per_cell=1",
    "eval.ddim_steps=[1]",
    "eval.classifier_steps=30",
    "eval.temporal_walks=0",  # no test here reads the temporal figure
    "tracker=none",
]
NAMES = ["tiny-000-seed1", "tiny-001-seed2"]


def test_deck_arithmetic_reproduced():
    rows = deck_sizing()
    assert [r["instance"] for r in rows] == ["g6.xlarge", "g6e.xlarge", "p5.4xlarge"]
    assert all(r["train_flops"] == pytest.approx(3 * 50e9 * 200_000 * 64) for r in rows)
    # "L4 ~15 hours, L40S ~5 hours, H100 ~2 hours"
    assert [round(r["hours"]) for r in rows] == [15, 5, 2]
    # "roughly $12, $9 and $12 per run"
    assert [round(r["usd_on_demand"]) for r in rows] == [12, 9, 12]
    assert rows[0]["hours"] == pytest.approx(1.92e18 / (121e12 * 0.3) / 3600)


def test_backward_is_about_twice_forward():
    m = measure_model(load_config().model)
    assert 2.5 < m["train_forward_ratio"] < 3.5
    assert m["forward_flops"] > 0 and m["activation_bytes_per_sample"] > 0


def test_measure_model_counts_the_step_of_the_configs_diffusion(monkeypatch):
    import qmind_render.sweeps.cost as cost

    seen, count = [], cost._counted_train_flops
    monkeypatch.setattr(
        cost, "_counted_train_flops", lambda m, x0, cond, d: seen.append(d) or count(m, x0, cond, d)
    )
    cfg = load_config(
        None,
        [
            "model.regression=false",
            "model.prediction=eps",
            "model.schedule=linear",
            "model.timesteps=50",
        ],
    )
    measure_model(cfg.model)
    # not Diffusion()'s defaults
    assert [(d.prediction, d.schedule, d.T) for d in seen] == [
        (Prediction.eps, Schedule.linear, 50)
    ]


def test_plan_numbers_and_budget(monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = load_config("quickstart", ["train.grad_accum=2"])
    p = plan_cost(cfg, budget=100.0, utilisation=0.5)
    assert p["samples"] == cfg.train.steps * cfg.train.batch * 2
    assert p["train_flops"] == pytest.approx(
        p["train_forward_ratio"] * p["forward_flops"] * p["samples"]
    )
    menu = load_menu()
    rows = {r["instance"]: r for r in p["instances"]}
    assert set(rows) == set(menu)
    l4 = rows["g6.xlarge"]
    assert l4["hours"] == pytest.approx(p["train_flops"] / (121e12 * 0.5) / 3600)
    assert l4["usd_on_demand"] == pytest.approx(l4["hours"] * 0.805)
    assert l4["runs_in_budget"] == math.floor(100.0 / l4["usd_on_demand"])
    # one GPU's share
    assert rows["p5.48xlarge"]["usd_on_demand"] == pytest.approx(
        rows["p5.48xlarge"]["hours"] * 55.04 / 8
    )
    assert rows["p5.4xlarge"]["usd_spot"] == pytest.approx(rows["p5.4xlarge"]["hours"] * 2.7)
    # no bf16 peak in the menu: not guessed
    assert rows["g5.xlarge"]["hours"] is None
    mem = p["memory_gb"]
    assert mem["adam"] == pytest.approx(2 * mem["weights"]) and mem["ema"] == pytest.approx(
        mem["weights"]
    )
    assert mem["total"] == pytest.approx(sum(v for k, v in mem.items() if k != "total"))
    with pytest.raises(KeyError, match="not in the menu"):
        plan_cost(cfg, instance="p9.huge")


def test_expand_coverage_and_encoding(monkeypatch):
    monkeypatch.chdir(REPO)
    cov = expand_sweep("sweeps/coverage.yaml")
    assert len(cov) == 9 and len({r.name for r in cov}) == 9
    assert (
        cov[0].name == "coverage-000-coverage_25-seed1"
        and cov[8].name == "coverage-008-coverage_75-seed3"
    )
    assert {(r.config["data"]["holdout"], r.config["seed"]) for r in cov} == {
        (h, s) for h in ("coverage_25", "coverage_50", "coverage_75") for s in (1, 2, 3)
    }
    assert all(r.config["name"] == r.name for r in cov)
    enc = expand_sweep("sweeps/encoding.yaml")
    # every theme encoding against every material encoding
    assert {(r.config["model"]["theme_enc"], r.config["model"]["material_enc"]) for r in enc} == {
        (t.value, m.value) for t in ThemeEnc for m in MaterialEnc
    }


def test_arms_change_one_thing_each_and_cross_the_grid(monkeypatch):
    """A sweep's `arms:` (issue 44's controls): each arm's overrides, crossed with the grid, named
    in the run and its point; the other arms keep the base; a malformed `arms:` is refused."""
    monkeypatch.chdir(REPO)
    runs = expand_sweep("sweeps/controls.yaml")
    got = {(r.point["arm"], r.point["seed"]): r for r in runs}
    assert len(runs) == 8 and set(got) == {
        (a, s) for a in ("regression", "trailing", "multi_step", "one_step") for s in (1, 2)
    }
    assert runs[0].name == "controls-000-regression-seed1"
    m = {a: got[(a, 1)].config for a in ("regression", "trailing", "multi_step", "one_step")}
    assert [m[a]["model"]["regression"] for a in m] == [True, False, False, False]
    assert [m[a]["model"]["t_end"] for a in m] == [0, 0, 400, 400]
    assert [m[a]["train"]["finetune_steps"] for a in m] == [0, 0, 0, 200]
    # the samples seen are the arms' common ground
    assert {(c["train"]["steps"], c["train"]["batch"]) for c in m.values()} == {(800, 8)}
    for bad in ({"x-y": []}, {"a": "model.regression=true"}, ["a"]):
        with pytest.raises(ValueError, match="arms"):
            load_sweep({"base": "quickstart", "arms": bad, "grid": {"seed": [1]}})


def test_dry_run_prints_runs_and_total(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert sweep_main(["sweeps/coverage.yaml", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("9 runs:") and "coverage-004-coverage_50-seed2" in out
    from qmind_render.sweeps.sweep import load_sweep

    # the CPU scale
    one = plan_cost(load_config("quickstart", load_sweep("sweeps/coverage.yaml")["overrides"]))[
        "instances"
    ][0]
    l4 = next(line for line in out.splitlines() if line.startswith("g6.xlarge"))
    assert l4.split()[3:6] == ["9", f"{9 * one['hours']:.3g}", f"{9 * one['usd_on_demand']:.3g}"]


def tiny_dir(
    tmp: Path, mp: pytest.MonkeyPatch, name: str = "tiny", grid: dict | None = None, **extra
) -> Path:
    """A working dir with its own store, runs and cache, the repo's splits and papermill notebook,
    and a tiny sweep file."""
    for k, sub in (("QMIND_STORE", "store"), ("QMIND_RUNS", "runs"), ("QMIND_CACHE", "cache")):
        mp.setenv(k, str(tmp / sub))
    (tmp / "sweeps").mkdir(exist_ok=True)
    if not (tmp / "sweeps" / "splits").exists():
        (tmp / "sweeps" / "splits").symlink_to(REPO / "sweeps" / "splits")
        (tmp / "nbs").mkdir()
        (tmp / "nbs" / "experiments").symlink_to(REPO / "nbs" / "experiments")
    (tmp / "sweeps" / f"{name}.yaml").write_text(
        json.dumps(
            {
                "base": str(REPO / "sweeps" / "exp" / "quickstart.yaml"),
                "overrides": TINY,
                "grid": grid or {"seed": [1, 2]},
                **extra,
            }
        )
    )
    return tmp / "sweeps" / f"{name}.yaml"


def kernel_of(run: str, runs: Path) -> int | None:
    """The pid of the papermill kernel executing `run` into `runs` (the local backend labels it with
    QMIND_RUN)."""
    want = {f"QMIND_RUN={run}".encode(), f"QMIND_RUNS={runs}".encode()}
    for d in Path("/proc").iterdir():
        try:
            if (
                d.name.isdigit()
                and b"ipykernel" in (d / "cmdline").read_bytes()
                and want <= set((d / "environ").read_bytes().split(b"\0"))
            ):
                return int(d.name)
        except OSError:
            continue
    return None


def wait_for(pred, timeout: float, what: str):
    end = time.monotonic() + timeout
    while not (v := pred()):
        if time.monotonic() > end:
            raise TimeoutError(what)
        time.sleep(0.05)
    return v


def sweep_out(argv: list[str]) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = sweep_main(argv)
    return rc, buf.getvalue()


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    """A real 2-seed sweep of the tiny config through papermill, run three times: the first is
    interrupted for real (SIGTERM to each run's kernel mid-training), the second resumes both from
    their checkpoints, the third skips both."""
    tmp = tmp_path_factory.mktemp("sweep")
    with pytest.MonkeyPatch.context() as mp:
        sweep = tiny_dir(tmp, mp)
        mp.chdir(tmp)
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from qmind_render.sweeps.sweep_cli import sweep_main; "
                "sys.exit(sweep_main(sys.argv[1:]))",
                str(sweep),
                "--jobs",
                "2",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:  # each run's kernel gets SIGTERM once it has logged two steps (of 8)
            todo = set(NAMES)

            def interrupt():
                for n in list(todo):
                    m = tmp / "runs" / n / "metrics.jsonl"
                    if m.is_file() and len(m.read_text().splitlines()) >= 2:
                        os.kill(
                            wait_for(
                                lambda n=n: kernel_of(n, tmp / "runs"),
                                10,
                                f"no kernel labelled {n}",
                            ),
                            signal.SIGTERM,
                        )
                        todo.discard(n)
                return not todo

            wait_for(interrupt, 600, f"runs never trained: {todo}")
            first_out, _ = proc.communicate(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
        interrupted = {
            n: {
                p.name: p.stat().st_mtime_ns
                for p in (tmp / "runs" / n / "checkpoints").glob("*.pt")
            }
            for n in NAMES
        }
        t1 = time.monotonic()
        second = sweep_out([str(sweep), "--jobs", "2"])
        t2 = time.monotonic()
        third = sweep_out([str(sweep), "--jobs", "2"])
        print(
            f"\ntiny sweep: first (interrupted) {t1 - t0:.1f} s, resume {t2 - t1:.1f} s, "
            f"rerun {time.monotonic() - t2:.1f} s"
        )
        yield {
            "dir": tmp,
            "sweep": sweep,
            "first": (proc.returncode, first_out),
            "interrupted": interrupted,
            "second": second,
            "third": third,
        }


def table_of(out: str) -> dict[str, list[str]]:
    lines = out[out.index("\nrun ") :].strip().splitlines()
    assert lines[0].split() == ["run", "status", "heldout_psnr", "in_dist_psnr", "ddim_steps"]
    return {line.split()[0]: line.split()[1:] for line in lines[1:] if line.startswith("tiny-")}


def test_local_sweep_end_to_end(tiny_sweep):
    rc, out = tiny_sweep["second"]
    assert rc == 0, out
    table = table_of(out)
    assert list(table) == NAMES
    for name, cells in table.items():
        rd = tiny_sweep["dir"] / "runs" / name
        ev = EvalResult.of_run(rd)
        assert Path(ev.checkpoint).name == "0000008.pt" and ev.headline_steps == 1
        h, t = ev.headline_psnr("heldout"), ev.headline_psnr("train")
        assert cells == [
            "done",
            format_table([{"x": h}]).split()[1],
            format_table([{"x": t}]).split()[1],
            "1",
        ]
        # the executed copy lands in the run dir
        assert (rd / "train.ipynb").is_file() and (rd / "params.yaml").is_file()
        assert json.loads((rd / "job.json").read_text())["state"] == "done"
        # it ends with the run's numbers and samples
        executed = json.loads((rd / "train.ipynb").read_text())
        assert "PSNR (dB) of run" in json.dumps(executed["cells"][-1]["outputs"])
        assert any("image/png" in o.get("data", {}) for o in executed["cells"][-1]["outputs"])
        # progress as each run goes
        assert f"{name}: started in {rd}  (seed=" in out and f"{name}: done after " in out
    assert isinstance(LocalBackend(), Backend)


def test_interrupted_runs_resume_and_finished_runs_are_skipped(tiny_sweep):
    rc, out = tiny_sweep["first"]
    # both runs were stopped: the sweep is not done
    assert rc == 1, out
    # the kernels' own notes go to each run's kernel.log
    assert "Kernel is running over TCP" not in out
    assert [cells[:2] for cells in table_of(out).values()] == [["failed", "-"], ["failed", "-"]]
    _, out2 = tiny_sweep["second"]
    for n in NAMES:
        # SIGTERM: the trainer checkpointed and returned
        ((k, mtime),) = tiny_sweep["interrupted"][n].items()
        step = int(k.removesuffix(".pt"))
        assert 2 <= step < 8, (n, k)
        rd = tiny_sweep["dir"] / "runs" / n
        assert f"{n}: queued" in out2
        nb = (rd / "train.ipynb").read_text()  # the rerun's executed notebook
        assert f"finished at step 8 (resumed from step {step}, {8 - step} steps this call)" in nb
        # the interrupted checkpoint was resumed, not redone
        assert (rd / "checkpoints" / k).stat().st_mtime_ns == mtime
        steps = [
            json.loads(line)["step"] for line in (rd / "metrics.jsonl").read_text().splitlines()
        ]
        # one curve: no step logged twice, none missing
        assert steps == list(range(1, 9))
    rc3, out3 = tiny_sweep["third"]
    assert rc3 == 0 and [f"{n}: done (finished earlier, skipped)" in out3 for n in NAMES] == [
        True,
        True,
    ]


def test_status_reads_the_job_records(tiny_sweep, monkeypatch, capsys):
    monkeypatch.chdir(tiny_sweep["dir"])
    monkeypatch.setenv("QMIND_RUNS", str(tiny_sweep["dir"] / "runs"))
    assert sweep_main([str(tiny_sweep["sweep"]), "--status"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[0], r[1], r[3], r[-1]) for r in rows] == [
        ("tiny-000-seed1", "local", "done", "1"),
        ("tiny-001-seed2", "local", "done", "1"),
    ]


def test_status_and_report_show_each_runs_headline_figure(tmp_path, monkeypatch, capsys):
    """A finished run whose step counts disagree (training cells best at 2 steps, held-out cells at
    1, the largest 4): `--status`, the summary and the report show its PSNR at 2 steps, the
    headline its evaluation chose on the training cells."""
    from qmind_render.core.checkpoint import checkpoint_name
    from qmind_render.sweeps.sweep_cli import sweep_summary
    from qmind_render.sweeps.sweep_report import sweep_results

    sweep = tiny_dir(tmp_path, monkeypatch, "hl", grid={"seed": [1]})
    (run,) = expand_sweep(sweep)
    rd, steps = tmp_path / "runs" / run.name, run.config["train"]["steps"]
    part = lambda ps: Part(10, {k: {"psnr": v} for k, v in ps.items()}, {"psnr": 18.0})  # noqa: E731
    held, train = part({1: 24.0, 2: 23.5, 4: 22.0}), part({1: 25.0, 2: 25.5, 4: 25.2})
    ev = EvalResult([1, 2, 4], {"heldout": held, "train": train}, step=steps)
    ev.checkpoint = str(rd / "checkpoints" / checkpoint_name(steps))
    ev.write(rd / "eval" / "eval.json")
    job = {"backend": "local", "run": run.name, "run_dir": str(rd), "steps": steps, "state": "done"}
    (rd / "job.json").write_text(json.dumps(job))
    assert sweep_main([str(sweep), "--status"]) == 0
    (row,) = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert row[3:] == ["done", "23.5", "25.5", "2"], row
    got = sweep_summary([run], [job], LocalBackend(tmp_path / "runs"))
    assert [(r["heldout_psnr"], r["in_dist_psnr"], r["ddim_steps"]) for r in got] == [
        (23.5, 25.5, 2)
    ]
    (r,) = sweep_results([run], {"seed": [1]}, tmp_path / "runs")
    assert (r["heldout_psnr"], r["in_dist_psnr"], r["ddim_steps"]) == (23.5, 25.5, 2)
    # an eval.json of a newer schema: one line naming the file and both versions, exit 2
    from qmind_render.cli import main

    (rd / "eval" / "eval.json").write_text(json.dumps(ev.to_json() | {"schema": 99}))
    assert main(["sweep", str(sweep), "--status"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and (
        f"{rd / 'eval' / 'eval.json'}: eval.json schema 99, but this qmind-render reads schemas "
        f"1 to {SCHEMA}" in err
    ), err


def test_sweep_report_from_the_real_runs(tiny_sweep, monkeypatch, capsys):
    monkeypatch.chdir(tiny_sweep["dir"])
    monkeypatch.setenv("QMIND_RUNS", str(tiny_sweep["dir"] / "runs"))
    assert sweep_main([str(tiny_sweep["sweep"]), "--report"]) == 0
    out = capsys.readouterr().out
    rep = tiny_sweep["dir"] / "runs" / "tiny-report"
    assert f"report: {rep / 'report.md'}" in out
    evs = [
        EvalResult.of_run(tiny_sweep["dir"] / "runs" / n)
        for n in ("tiny-000-seed1", "tiny-001-seed2")
    ]
    h = [e.headline_psnr("heldout") for e in evs]
    res = json.loads((rep / "results.json").read_text())
    assert [r["heldout_psnr"] for r in res["runs"]] == pytest.approx(h)
    # grid is seeds only: one group of two
    (g,) = res["groups"]
    assert g["seeds"] == 2 and g["heldout_psnr"] == pytest.approx(sum(h) / 2)
    # sample std of two values
    assert g["heldout_psnr_std"] == pytest.approx(abs(h[0] - h[1]) / 2**0.5)
    md = (rep / "report.md").read_text()
    assert (
        "![PSNR](psnr.png)" in md and f"{g['heldout_psnr']:.2f} ± {g['heldout_psnr_std']:.2f}" in md
    )
    assert "| tiny-001-seed2 | done | 2 |" in md
    png = (rep / "psnr.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_aggregate_groups_by_the_non_seed_keys():
    rows = [
        {"h": c, "seed": s, "heldout_psnr": v, "in_dist_psnr": 20.0, "baseline_psnr": 19.0}
        for c, s, v in (
            ("coverage_25", 1, 17.0),
            ("coverage_25", 2, 19.0),
            ("coverage_50", 1, 21.0),
        )
    ]
    rows.append({"h": "coverage_50", "seed": 2, "heldout_psnr": None})  # not finished: left out
    a = aggregate(rows, ["h"])
    assert [
        (x["h"], x["seeds"], x["heldout_psnr"], x["heldout_psnr_min"], x["heldout_psnr_max"])
        for x in a
    ] == [("coverage_25", 2, 18.0, 17.0, 19.0), ("coverage_50", 1, 21.0, 21.0, 21.0)]
    assert a[0]["heldout_psnr_std"] == pytest.approx(2**0.5) and a[1]["heldout_psnr_std"] == 0.0


def test_report_files_are_written_whole_and_the_plot_is_a_figure(tmp_path, monkeypatch):
    """write_report writes report.md and psnr.png through util (atomic_write, save_figure);
    plot_sweep hands back its Figure, pyplot untouched."""
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from qmind_render.sweeps import sweep_report
    from qmind_render.core.checkpoint import checkpoint_name

    s = {"name": "two", "base": "quickstart", "grid": {"seed": [1, 2]}}
    # what evaluate leaves in a run dir, for its final checkpoint
    for r in expand_sweep(s, root=REPO):
        part = Part(at={1: {"psnr": 20.0 + r.config["seed"]}}, baseline={"psnr": 18.0})
        ev = tmp_path / "runs" / r.name / "eval" / "eval.json"
        ck = ev.parents[1] / "checkpoints" / checkpoint_name(r.config["train"]["steps"])
        EvalResult(
            [1],
            {"heldout": part, "train": part},
            checkpoint=str(ck),
            step=r.config["train"]["steps"],
        ).write(ev)
    from qmind_render import util

    # report.md directly, psnr.png through util.save_figure
    written, real = [], util.atomic_write
    record = lambda path, *a, **k: written.append(Path(path).name) or real(path, *a, **k)  # noqa: E731
    monkeypatch.setattr(sweep_report, "atomic_write", record)
    monkeypatch.setattr(util, "atomic_write", record)
    before = plt.get_fignums()
    rep = sweep_report.write_report(s, tmp_path / "report", root=tmp_path / "runs", sweep_root=REPO)
    assert (
        {"report.md", "psnr.png"} <= set(written)
        and isinstance(rep["figure"], Figure)
        and plt.get_fignums() == before
    )
    # no temporary left
    assert rep["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not list(
        (tmp_path / "report").glob(".*")
    )
    assert isinstance(sweep_report.plot_sweep(rep["groups"], rep["rows"], []), Figure)


def test_multirun_from_the_command_line_and_its_wall_time(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert (
        sweep_main(
            [
                "quickstart",
                "-m",
                "seed=1,2",
                "data.holdout=coverage_50,coverage_75",
                "train.steps=40",
                "--dry-run",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        out.startswith("4 runs:")
        and "quickstart-003-seed2-coverage_75  (seed=2 data.holdout=coverage_75)" in out
    )
    assert (
        "wall time on the local backend: about " in out and "measured on this machine's CPU" in out
    )
    with pytest.raises(
        ValueError,
        match=r"no such sweep file; .* add -m, e\.g\. qmind sweep quickstart -m seed=1,2,3",
    ):
        sweep_main(["quickstart", "seed=1,2"])
    with pytest.raises(ValueError, match="-m needs at least one key with a comma list"):
        sweep_main(["quickstart", "-m", "seed=1"])


def test_wall_time_follows_the_steps(monkeypatch):
    from qmind_render.sweeps.cost import estimate_wall
    from qmind_render.sweeps.sweep import multirun

    monkeypatch.chdir(REPO)
    runs = expand_sweep(multirun("quickstart", ["train.steps=100,1600"]))
    w = estimate_wall(runs, "local")
    # one measurement for the two
    assert w["runs"][0]["step_s"] == w["runs"][1]["step_s"] > 0
    # 16x the steps, the same evaluation
    assert 3 < w["runs"][1]["minutes"] / w["runs"][0]["minutes"] < 16
    assert w["wall_minutes"] == pytest.approx(
        w["runs"][0]["minutes"] + w["runs"][1]["minutes"], abs=0.11
    )


def test_sweep_help_documents_the_file_format():
    r = subprocess.run(
        [sys.executable, "-m", "qmind_render.cli", "sweep", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        r.returncode == 0
        and "a sweep file (YAML):" in r.stdout
        and "grid:" in r.stdout
        and "-m seed=1,2,3" in r.stdout
    )
