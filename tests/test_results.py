"""Committed results agree with what they claim: each results/NAME/README.md table is what
tools/collect_results.py reads from the eval.json and config.yaml beside it, the committed
quickstart config is the one measured there, each committed sweep's report is what its runs'
eval.json give, and the results chapter shows those numbers."""

import functools
import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from collect_sweep import report_from_results  # noqa: E402

from qmind_render.core.eval_result import EvalResult  # noqa: E402
from qmind_render.core.config import config_to_dict, load_config  # noqa: E402
from qmind_render.core.intervals import with_interval  # noqa: E402
from qmind_render.sweeps.cost import sweep_cost  # noqa: E402
from qmind_render.sweeps.sweep import expand_sweep  # noqa: E402
from qmind_render.sweeps.sweep_report import (  # noqa: E402
    arms_table,
    coverage_table,
    group_table,
    headline_runs,
    read_results,
    levels_table,
    paired_difference,
    paths_table,
    pooled,
    result_table,
    separation_table,
    steps_table,
    switches,
)
from qmind_render.util import format_table  # noqa: E402
from qmind_render.sweeps import sweep_report  # noqa: E402

# A committed run's row and a committed sweep's groups are read from files no test writes: each is
# read once for this module (several tests compare the same runs; each read parses the run's
# eval.json and bootstraps its intervals). Tests only read what these return.
run_row = functools.cache(sweep_report.run_row)


@functools.cache
def _groups(d: Path, sweep_root: Path):
    return sweep_report.committed_groups(d, sweep_root=sweep_root)


def committed_groups(d: Path, key=None, sweep_root: Path = ROOT):
    "sweep_report.committed_groups, read once per sweep where grouped by arm (no `key`)."
    if key is None:
        return _groups(d, sweep_root)
    return sweep_report.committed_groups(d, key=key, sweep_root=sweep_root)


SWEEPS = sorted(p.parent for p in (ROOT / "results").glob("*/sweep.yaml"))


@pytest.fixture(scope="module", autouse=True)
def configs_resolved_once():
    """Each sweep's runs and each saved config resolved once for this module: resolving a config
    (OmegaConf) takes a tenth of a second, and the tests below resolve the same committed ones over
    and over (a report remade, then read again; a run's row resolves its config twice). The same
    functions, given the same files, give the same answers; nothing here changes what they return.
    Put back when the module ends."""
    import qmind_render.core.config as config

    expand, from_dict = sweep_report.expand_sweep, config.config_from_dict

    @functools.cache
    def _expanded(sweep: str, overrides: tuple, root):
        return expand(sweep, list(overrides), root)

    def expand_once(sweep, overrides=(), root=None):
        if isinstance(sweep, dict):
            return expand(sweep, overrides, root)
        return list(_expanded(str(sweep), tuple(overrides), None if root is None else str(root)))

    @functools.cache
    def _from(d: str, overrides: tuple):
        return from_dict(json.loads(d), list(overrides))

    def from_dict_once(d, overrides=()):
        try:
            key = json.dumps(d, sort_keys=True)
        except TypeError:  # not plain data (a loaded config): resolved as before, each time
            return from_dict(d, overrides)
        return _from(key, tuple(overrides))

    mp = pytest.MonkeyPatch()
    mp.setattr(sweep_report, "expand_sweep", expand_once)
    mp.setattr(config, "config_from_dict", from_dict_once)
    try:
        yield
    finally:
        mp.undo()


def test_every_results_table_row_is_read_from_its_committed_files():
    # every results dir but the sweeps' and a benchmark's (results/temporal: bench.json)
    names = sorted(
        p.parent
        for p in (ROOT / "results").glob("*/README.md")
        if p.parent not in SWEEPS and not (p.parent / "bench.json").is_file()
    )
    assert names, "no committed results"
    for d in names:
        text = (d / "README.md").read_text()
        runs = sorted(p.parent for p in d.glob("*/eval.json"))
        assert runs, d
        for run in runs:
            r = run_row(run)
            line = next((ln for ln in text.splitlines() if ln.startswith(f"| {run.name} |")), None)
            assert line is not None, f"{d.name}/README.md has no row for {run.name}"
            for col in ("held-out 1", "gap 1", "SSIM 1", "theme agr.", "lighting agr."):
                assert f"| {r[col]} |" in line, (
                    f"{d.name}/{run.name}: {col} is {r[col]} in eval.json"
                )


def test_the_committed_quickstart_is_the_measured_one():
    # the main job as it resolves now (the defaults), against the saved config of the run measured
    now = config_to_dict(load_config("quickstart", root=ROOT))
    ran = yaml.safe_load((ROOT / "results" / "main" / "quickstart" / "config.yaml").read_text())
    assert switches(now) == switches(ran)


def test_each_committed_sweep_report_is_remade_from_its_runs(tmp_path):
    assert {d.name for d in SWEEPS} >= {"coverage", "encoding", "switches", "gap"}
    for d in SWEEPS:
        out = tmp_path / d.name
        report_from_results(d, out, sweep_root=ROOT)
        assert json.loads((out / "results.json").read_text()) == json.loads(
            (d / "results.json").read_text()
        ), d.name
        assert (out / "report.md").read_text() == (d / "report.md").read_text(), d.name


def _held_out_by_group(d: Path, by: list[str]) -> dict[tuple, list[float]]:
    """Each run's held-out PSNR at its headline DDIM step count, read from its committed files, by
    group."""
    groups: dict[tuple, list[float]] = {}
    for run in sorted((d / "runs").iterdir()):
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        ev = EvalResult.read(run / "eval" / "eval.json")
        key = tuple(cfg[k.split(".")[0]][k.split(".")[1]] for k in by)
        groups.setdefault(key, []).append(ev.headline_psnr("heldout"))
    return groups


def chapter_outputs() -> str:
    "Every text the results chapter stores, joined."
    nb = json.loads((ROOT / "nbs" / "sweeps" / "89_results.ipynb").read_text())
    return "\n".join(
        "".join(o.get("data", {}).get(kind, o.get("text", "")))
        for c in nb["cells"]
        if c["cell_type"] == "code"
        for o in c["outputs"]
        for kind in ("text/markdown", "text/plain")
    )


def test_the_results_chapter_shows_the_committed_runs():
    shown = chapter_outputs()
    for name in ("coverage", "encoding", "switches", "gap"):
        res = read_results(ROOT / "results" / name, ROOT)
        assert group_table(res["groups"], res["by"]) in shown, (
            f"89_results: {name}'s group table is stale"
        )
        assert separation_table(res["groups"], res["by"]) in shown, (
            f"89_results: {name}'s separations are stale"
        )
        for key, vals in _held_out_by_group(ROOT / "results" / name, res["by"]).items():
            assert f"| {sum(vals) / len(vals):.2f} ± " in shown, (
                f"89_results: {name} {key} mean of {vals} not shown"
            )
    gpu = format_table(
        sweep_cost(expand_sweep(ROOT / "sweeps" / "coverage_gpu.yaml", (), ROOT), 0.4)
    )
    assert gpu in shown, "89_results: the GPU sweep's cost is stale"


def _tables(text: str) -> list[list[str]]:
    "Each Markdown table in `text` as its lines (header first)."
    tables, cur = [], []
    for ln in text.splitlines() + [""]:
        if ln.startswith("|"):
            cur.append(ln)
        elif cur:
            tables.append(cur)
            cur = []
    return tables


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_every_column_of_every_run_table_in_the_results_chapter_is_the_committed_one():
    """Every table of the results chapter whose rows are runs: each column that `run_row` makes
    holds the committed eval.json's value, for every row."""
    runs = {
        run.name: run
        for run in [
            *(run for d in SWEEPS for run in sorted((d / "runs").iterdir())),
            *sorted(p.parent for p in (ROOT / "results" / "main").glob("*/eval.json")),
            *sorted(p.parent for p in (ROOT / "results" / "shipped").glob("*/eval.json")),
        ]
    }
    checked = 0
    for table in _tables(chapter_outputs()):
        head = _cells(table[0])
        if head[0] != "run":
            continue
        for line in table[2:]:
            vals = dict(zip(head, _cells(line)))
            r = run_row(runs[vals["run"]])
            for col, v in vals.items():
                if col in r:
                    assert v == str(r[col]), f"89_results: {vals['run']}'s {col} is {r[col]}"
                    checked += 1
    assert checked > 300, checked


HEADLINE = headline_runs(ROOT / "results")


def test_the_readme_headline_is_the_committed_results():
    """The README's headline table is the one the committed main job's and shipped model's
    eval.json make, and the figures its prose quotes are theirs."""
    readme = (ROOT / "README.md").read_text()
    assert result_table(HEADLINE) in readme, (
        "README: the headline table is stale (python tools/readme_headline.py)"
    )
    for name, run in HEADLINE.items():
        ev = EvalResult.of_run(run)
        k, h = ev.headline_steps, ev.part("heldout")
        a = h.at[k]
        phrases = [
            with_interval(a["psnr"], a["ci"]["psnr"]),
            with_interval(a["over_additive"]["psnr"], a["over_additive"]["ci"]["psnr"]),
            with_interval(a["texture"], a["ci"]["texture"], ".3f"),
            f"{h.baseline_additive['psnr']:.2f}",
        ]
        if name == "shipped model":
            phrases += [
                with_interval(a["psnr_walls"], a["ci"]["psnr_walls"]),
                f"{ev.parts['train'].psnr(k):.2f} dB on the cells it trained on",
            ]
        # the prose is wrapped: compare with its lines joined
        prose = " ".join(readme.split())
        for phrase in phrases:
            assert phrase in prose, f"README: {name}'s {phrase} is not what it quotes"


def test_the_readmes_figures_for_the_replaced_diffusion_model_are_its_committed_ones():
    "The README's figures for the one-step diffusion model the shipped regressor replaced."
    ev = EvalResult.of_run(ROOT / "results" / "shipped" / "shipped-diffusion")
    a = ev.part("heldout").at[ev.headline_steps]
    psnr = with_interval(a["psnr"], a["ci"]["psnr"])
    said = (
        f"The one-step diffusion model it replaced scored {psnr} dB with texture {a['texture']:.3f}"
    )
    assert said in " ".join((ROOT / "README.md").read_text().split()), said


def test_the_results_chapter_shows_the_headline_table():
    assert result_table(HEADLINE) in chapter_outputs(), "89_results: the headline table is stale"


def test_the_results_chapter_shows_each_runs_gap_and_recall():
    "Each run of every sweep, the main job and the shipped model is a table row."
    shown = chapter_outputs().splitlines()
    runs = [
        *(run for d in SWEEPS for run in sorted((d / "runs").iterdir())),
        *sorted(p.parent for p in (ROOT / "results" / "main").glob("*/eval.json")),
        *sorted(p.parent for p in (ROOT / "results" / "shipped").glob("*/eval.json")),
    ]
    # the four earlier sweeps, issue 44's (the controls at least), the main job's and the shipped
    assert len(runs) >= 9 + 12 + 6 + 8 + 8 + 6 + 1
    for run in runs:
        r = run_row(run)
        line = next((ln for ln in shown if ln.startswith(f"| {run.name} |")), None)
        assert line is not None, f"89_results shows no row for {run.name}"
        figs = ("held-out 1", "train", "gap", "matched gap", "recall")
        for col in [c for c in r if c.startswith(figs)]:
            assert f"| {r[col]} |" in line, f"89_results: {run.name}'s {col} is {r[col]}"


def test_the_readmes_temporal_figures_are_the_committed_bench():
    "The README's world-noise figures are results/temporal/bench.json's."
    b = json.loads((ROOT / "results" / "temporal" / "bench.json").read_text())
    prose = " ".join((ROOT / "README.md").read_text().split())
    said = (
        "world noise cuts the one-step diffusion model's figure (shipped until issue 44, "
        f"`assets/diffusion.pt`) from {b['screen_steps2_difference']:.2f} and "
        f"{b['screen_steps4_difference']:.2f} to {b['world_steps2_difference']:.2f} and "
        f"{b['world_steps4_difference']:.2f}"
    )
    assert said in prose, "README: the temporal figures are not results/temporal/bench.json's"
    assert f"({b['world_steps1_difference']:.2f} with world noise" in prose
    # and the temporal chapter's
    nb = json.loads((ROOT / "nbs" / "core" / "58_temporal.ipynb").read_text())
    text = " ".join(
        " ".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown").split()
    )
    assert (
        f"from {b['screen_steps2_difference']:.2f} and {b['screen_steps4_difference']:.2f} to "
        f"{b['world_steps2_difference']:.2f} and {b['world_steps4_difference']:.2f}" in text
    ), "58_temporal: the temporal figures are not results/temporal/bench.json's"


def test_the_results_chapter_shows_issue_44s_tables():
    """The controls' step table and where their steps go wrong, and the coverage, novelty,
    encoding and objective tables, as the committed runs make them (each sweep once committed)."""
    shown = chapter_outputs()
    res = ROOT / "results"
    controls = committed_groups(res / "controls", sweep_root=ROOT)
    assert set(controls) == {"regression", "trailing", "multi_step", "one_step"}
    assert steps_table(controls) in shown, "89_results: the controls' table is stale"
    assert paths_table(controls) in shown, "89_results: the controls' step paths are stale"
    made = {
        "coverage_nested": lambda g: coverage_table(g, ROOT),
        "novelty": lambda g: levels_table([ev for evs in g.values() for ev in evs], ROOT),
        "encoding_arms": lambda g: arms_table(g, "planes", k=1),
        "objective": lambda g: arms_table(g, "v / x0"),
    }
    key = {"coverage_nested": lambda r: r["data.holdout"].split("-s")[0]}
    for name, make in made.items():
        groups = committed_groups(res / name, key=key.get(name), sweep_root=ROOT)
        if groups:
            assert make(groups) in shown, f"89_results: {name}'s table is stale"
        else:
            assert f"results/{name}: not run yet" in shown


def test_the_results_chapter_shows_issue_45s_tables():
    """The held-out-theme arms, compared within each held-out theme, as the committed runs make
    them; and the README's held-out-theme figures are theirs."""
    shown = chapter_outputs()
    themes = committed_groups(
        ROOT / "results" / "themes_out", key=lambda r: r["arm"], sweep_root=ROOT
    )
    if not themes:
        assert "results/themes_out: not run yet" in shown
        return
    assert set(themes) == {"planes", "vector", "planes_random", "vector_random"}
    assert all(len(evs) == 10 for evs in themes.values())
    table = arms_table(themes, "planes", k=1, by=lambda ev: ev.split)
    assert table in shown, "89_results: the held-out-theme table is stale"
    prose = " ".join((ROOT / "README.md").read_text().split())
    planes = pooled(themes["planes"], 1)
    d = paired_difference(themes["planes_random"], 1, themes["planes"], 1, by=lambda ev: ev.split)
    assert f"scores {with_interval(planes['psnr'], planes['psnr_ci'])} dB" in prose
    assert f"by {with_interval(d['diff'], d['ci'])} dB" in prose
    from qmind_render.core.new_themes import measured_new_themes

    ship = measured_new_themes(None)  # the shipped model's, tied to its file's sha256
    assert ship is not None, "qmind_render/assets/shipped_new_themes.json: run `qmind themes`"
    assert f"{with_interval(ship['psnr'], ship['psnr_ci'])} dB on 8 random themes" in prose
    near = with_interval(ship["nearest_psnr"], ship["nearest_psnr_ci"])
    assert f"{near} dB for painting the nearest grid theme" in prose
    v = paired_difference(themes["vector"], 1, themes["planes"], 1, by=lambda ev: ev.split)
    assert (
        f"as its parameter vector, {with_interval(v['diff'], v['ci'])} dB against planes" in prose
    )


def test_the_readmes_random_theme_figures_at_400_steps_are_the_committed_ones():
    """What random themes cost the grid's test cells and buy on new themes at 400 steps
    (results/themes_grid against results/encoding_arms' planes), as the README says them."""
    from qmind_render.core.new_themes import figure_name, new_themes_difference

    grid = committed_groups(
        ROOT / "results" / "themes_grid", key=lambda r: r["arm"], sweep_root=ROOT
    )
    enc = committed_groups(ROOT / "results" / "encoding_arms", sweep_root=ROOT)

    def new_themes(dest, arm):
        rows = read_results(dest, ROOT)["rows"]
        runs = [dest / "runs" / r["run"] / "eval" / figure_name() for r in rows if r["arm"] == arm]
        return [json.loads(f.read_text()) for f in runs]

    cost = paired_difference(grid["planes_random"], 1, enc["planes"], 1)
    na = new_themes(ROOT / "results" / "themes_grid", "planes_random")
    nb = new_themes(ROOT / "results" / "encoding_arms", "planes")
    assert len(na) == len(grid["planes_random"]) and len(nb) == len(enc["planes"])
    gain = new_themes_difference(na, nb)
    prose = " ".join((ROOT / "README.md").read_text().split())
    assert f"by {with_interval(gain['diff'], gain['ci'])} dB, for" in prose
    assert f"{with_interval(cost['diff'], cost['ci'])} dB on the grid's own test cells" in prose


def test_the_shipped_model_is_the_one_the_choice_on_validation_picks():
    """Issue 45's candidates with random themes against the model trained on the grid alone, as
    `ship_choice` makes them from the committed files: the package ships the model the choice
    picks (by `data.themes`), and the README's and the chapter's figures for them are these."""
    from qmind_render.core.checkpoint import read_shipped
    from qmind_render.core.config import config_from_dict
    from qmind_render.core.new_themes import figure_name
    from qmind_render.sweeps.sweep_report import ship_choice, ship_pick

    def run(name):
        d = ROOT / "results" / "shipped" / name
        nt = {s: json.loads((d / figure_name(s)).read_text()) for s in ("test", "validation")}
        return load_config(d / "config.yaml").data.themes, EvalResult.of_run(d), nt

    grid_themes, grid, grid_nt = run("shipped")
    assert grid_themes == "grid"
    cands = {name: run(name) for name in ("shipped_random", "shipped_share15")}
    assert [c[0] for c in cands.values()] == ["grid+random:16", "grid+random:16@15"]
    choices = {name: ship_choice(ev, nt, grid, grid_nt) for name, (_, ev, nt) in cands.items()}
    pick = ship_pick(choices)
    shipped = config_from_dict(read_shipped()["config"]).data.themes
    assert shipped == (cands[pick][0] if pick else grid_themes), shipped
    # the shipped model's own new-theme figure is its run's (the bf16 file scores within 0.05 dB)
    ship = json.loads((ROOT / "qmind_render" / "assets" / "shipped_new_themes.json").read_text())
    assert abs(ship["psnr"] - grid_nt["test"]["psnr"]) < 0.05
    prose = " ".join((ROOT / "README.md").read_text().split())
    shown = chapter_outputs()
    for name, choice in choices.items():
        for key in ("themes_test", "grid_test"):
            said = with_interval(choice[key]["diff"], choice[key]["ci"])
            assert said in prose, f"README: {name}'s {key} figure is not {said}"
            assert said in shown, f"89_results: {name}'s {key} figure is not {said}"
        for key in ("themes_validation", "grid_validation"):
            assert with_interval(choice[key]["diff"], choice[key]["ci"]) in shown, (name, key)


def test_the_readmes_controls_figures_are_the_committed_ones():
    """What the README says diffusion adds (the regressor against the best diffusion recipe, frame
    by frame) and what the main job replaced are the committed runs' figures."""
    from qmind_render.sweeps.sweep_report import chosen_steps

    prose = " ".join((ROOT / "README.md").read_text().split())
    g = committed_groups(ROOT / "results" / "controls", sweep_root=ROOT)
    best = max(
        (a for a in g if a != "regression"),
        key=lambda a: pooled(g[a], chosen_steps(g[a]))["psnr"],
    )
    assert best == "multi_step" and chosen_steps(g[best]) == 2
    d = paired_difference(g["regression"], 1, g[best], 2)
    assert d["separated"] and f"by {with_interval(d['diff'], d['ci'])} dB frame by frame" in prose
    old = EvalResult.of_run(ROOT / "results" / "main" / "diffusion-onestep")
    a = old.part("heldout").at[old.headline_steps]
    assert f"up from {a['psnr']:.2f} for the one-step diffusion recipe" in prose
    assert f"(was {a['texture']:.3f})" in prose
