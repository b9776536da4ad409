"""The yardsticks (core/55_yardsticks): the additive baseline beats the flat one on held-out cells
and never fits a held-out cell's pixels; the factor classifiers know the factors of true held-out
frames and know nothing from the geometry alone."""

import numpy as np
import pytest
import torch

from qmind_render.core.walks import paired_batch, walk_frames
from qmind_render.core.yardsticks import (
    AdditiveColour,
    MeanColour,
    classifier_batch,
    classify,
    factor_labels,
    fit_classifier,
)
from qmind_render.data.splits import LeakError, load_split


@pytest.fixture(scope="module")
def split():
    return load_split("balanced_20")


@pytest.fixture(scope="module")
def fit_on(split):
    return classifier_batch(split, 4000, 16)  # evaluation's defaults: 16 a cell, 300 steps


@pytest.fixture(scope="module")
def additive_on(fit_on):
    """Every other frame of `fit_on`, 8 a cell: what the baselines' comparisons fit on (the
    additive fit's cost grows with its pixels; its lead over the flat one is 8.1 dB on these, 9.0
    on all of `fit_on`)."""
    return {k: v[::2] for k, v in fit_on.items()}


@pytest.fixture(scope="module")
def held(split):
    return paired_batch(walk_frames(3000, 8, 32, split.grid.material), split.held_out)


@pytest.fixture(scope="module")
def sizes(split):
    return {
        "theme": split.grid.theme,
        "lighting": split.grid.light,
        "material": split.grid.material,
    }


def _psnr(pred, batch, walls: bool = False) -> float:
    p, t = (torch.as_tensor(np.asarray(x)).float() / 255 for x in (pred, batch["rgb"]))
    err = ((p - t) ** 2).mean(-1)
    w = (batch["surface"] == 1).float() if walls else torch.ones_like(err)
    mse = (err * w).sum((1, 2)) / w.sum((1, 2)).clamp(min=1)
    return (-10 * torch.log10(mse.clamp(min=1e-10))).mean().item()


def test_classifier_batch_holds_training_cells_only(split, fit_on):
    assert not fit_on["cells"][:, split.mask()].any()
    assert fit_on["cells"][:, ~split.mask()].any(0).all()  # every training cell is there


def test_additive_beats_the_mean_colour_on_held_out_cells(split, additive_on, held):
    flat, add = (
        MeanColour(split.grid.theme).fit(additive_on),
        AdditiveColour(split).fit(additive_on),
    )
    for walls in (False, True):
        assert _psnr(add.predict(held), held, walls) > _psnr(flat.predict(held), held, walls) + 5


def test_additive_composes_without_texture_too(split, additive_on, held):
    flat, add = MeanColour(split.grid.theme).fit(additive_on), AdditiveColour(split, uv_bins=0)
    assert _psnr(add.fit(additive_on).predict(held), held) > _psnr(flat.predict(held), held) + 3


def test_additive_refuses_a_batch_that_shows_a_held_out_cell(split, fit_on, held):
    """One held-out frame among training frames: the fit is refused, naming the cell, and the
    baseline stays unfitted (a held-out pixel never enters a term)."""
    mixed = {k: torch.cat([fit_on[k][:50], held[k][:1]]) for k in fit_on}
    add = AdditiveColour(split)
    with pytest.raises(LeakError, match=r"held-out cell \(0, 0, 0\)"):
        add.fit(mixed)
    with pytest.raises(ValueError, match="fit it on training-cell frames"):
        add.predict(held)
    with pytest.raises(ValueError, match="`cells` mask"):
        add.fit({k: v for k, v in fit_on.items() if k != "cells"})


@pytest.fixture(scope="module")
def clf(fit_on, sizes):
    return fit_classifier(fit_on, sizes, 300)


def test_classifiers_know_the_factors_of_true_held_out_frames(clf, held):
    acc = classify(clf, held["rgb"], held)
    assert acc["material"] >= 0.9 and acc["theme"] >= 0.9 and acc["lighting"] >= 0.9, acc


def test_classifiers_are_at_chance_on_noise_frames(clf, held):
    noise = torch.randint(
        0, 256, held["rgb"].shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    acc = classify(clf, noise.numpy(), held)
    assert all(v <= 0.4 for v in acc.values()), acc


def test_classifiers_fitted_on_shuffled_labels_are_at_chance(fit_on, held, sizes):
    """Labels permuted across frames before fitting: nothing in the frames can give them back."""
    perm = torch.randperm(len(fit_on["rgb"]), generator=torch.Generator().manual_seed(0))
    shuffled = {**fit_on, "theme": fit_on["theme"][perm], "lighting": fit_on["lighting"][perm]}
    # each frame is one material: the permuted frame's, on this frame's walls
    shuffled["material"] = torch.where(
        fit_on["surface"] == 1,
        factor_labels(fit_on, 5)["material"][perm][:, None, None].to(torch.uint8),
        torch.tensor(255, dtype=torch.uint8),
    )
    acc = classify(fit_classifier(shuffled, sizes, 200), held["rgb"], held)
    assert all(v <= 0.45 for v in acc.values()), acc
