"""Intervals across runs: a sweep's groups carry the held-out PSNR's interval over split draws,
seeds, cells and frames when their runs kept their per-frame figures, and not otherwise."""

import numpy as np

from qmind_render.core.intervals import mean_interval, runs_interval
from qmind_render.sweeps.sweep_report import CI, aggregate, group_table


def _rows(values):
    return [
        {"run": f"r{i}", "h": "x", "heldout_psnr": v, "in_dist_psnr": v + 1, "baseline_psnr": 20.0}
        for i, v in enumerate(values)
    ]


def test_a_group_whose_runs_disagree_gets_a_wide_interval_and_the_table_shows_it():
    rng = np.random.default_rng(0)
    test = np.zeros(100, bool)
    test[:10] = True
    # three draws x seeds, 3 dB apart, each with cells and frames of their own spread
    frames = {
        f"r{i}": (v + rng.normal(0, 1, (100, 8)), test) for i, v in enumerate((24.0, 27.0, 30.0))
    }
    rows = _rows([float(m[t].mean()) for m, t in frames.values()])
    (g,) = aggregate(rows, ["h"], frames=frames)
    lo, hi = g["heldout_psnr_ci"]
    one = mean_interval(frames["r0"][0], test)
    assert lo < 25.5 and hi > 28.5 and hi - lo > 3 * (one[1] - one[0])
    table = group_table([g], ["h"])
    assert CI in table and f"[{lo:.2f}, {hi:.2f}]" in table


def test_groups_without_per_frame_figures_are_reported_as_before():
    (g,) = aggregate(_rows([25.0, 26.0]), ["h"])
    assert "heldout_psnr_ci" not in g and CI not in group_table([g], ["h"])
    # a group only part of whose runs kept their frames gets no interval either
    frames = {"r0": (np.full((100, 8), 25.0), np.ones(100, bool))}
    (g,) = aggregate(_rows([25.0, 26.0]), ["h"], frames=frames)
    assert "heldout_psnr_ci" not in g


def test_runs_interval_is_seeded():
    m = [np.random.default_rng(i).normal(25, 2, (20, 8)) for i in range(3)]
    assert runs_interval(m, seed=4) == runs_interval(m, seed=4) != runs_interval(m, seed=5)
