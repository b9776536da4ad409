"""The frame metrics on known answers (`nbs/core/53_metrics.ipynb` holds the table as examples):
the truth is perfect, each distortion worse by a stated amount, texture punishes blur where PSNR
and SSIM do not, masks behave, and the unmasked figures are evaluation's own."""

import numpy as np
import pytest
import torch

from qmind_render.core.metrics import (
    DISTORTIONS,
    METRICS,
    as_float,
    blurred,
    distortions,
    gaussian_blur,
    known_answers,
    psnr,
    score_frames,
    ssim,
    ssim_map,
    texture,
    wall_mask,
)
from qmind_render.core.walks import paired_batch, walk_frames
from qmind_render.world.skinner import SURFACES

# two unseen-walk frames in each of five cells (one per theme, every material)
CELLS = [(0, 0, 0), (1, 1, 3), (2, 2, 1), (3, 3, 2), (4, 4, 0)]


@pytest.fixture(scope="module")
def batch():
    return paired_batch(walk_frames(5000, 2, 32, 5), CELLS)


@pytest.fixture(scope="module")
def answers(batch):
    return known_answers(batch)


def test_the_truth_is_perfect_and_every_distortion_worse_on_every_metric(answers):
    assert list(answers) == list(DISTORTIONS)
    assert answers["truth"] == {m: (100.0 if m.startswith("psnr") else 1.0) for m in METRICS}
    for name in DISTORTIONS[1:]:
        worse = {m: answers[name][m] < answers["truth"][m] for m in METRICS}
        assert all(worse.values()), (name, answers[name])
    # the wrong theme is the worst on every figure
    for m in METRICS:
        assert answers["wrong theme"][m] == min(r[m] for r in answers.values()), m


def test_known_answers_by_their_amounts(answers):
    blur, noise, wrong, shift, flat = (answers[k] for k in DISTORTIONS[1:])
    assert 27 < blur["psnr"] < 33 and 0.7 < blur["ssim"] < 0.92 and 0.38 < blur["texture"] < 0.65
    assert 29 < noise["psnr"] < 32 and 0.6 < noise["texture"] < 0.9
    assert 13 < wrong["psnr"] < 21 and wrong["texture"] < 0.2 and wrong["ssim"] < 0.45
    assert 24 < shift["psnr"] < 30 and 0.35 < shift["texture"] < 0.65
    assert 22 < flat["psnr"] < 31 and flat["texture"] < 0.35 and flat["texture_walls"] < 0.3


def test_blur_costs_texture_far_more_than_psnr(answers):
    """Against the noisy frame as the yardstick: PSNR and SSIM put the blurred frame level with it
    or above; texture puts it far below, losing about half its figure."""
    blur, noise = answers["blurred"], answers["noisy"]
    assert blur["psnr"] > noise["psnr"] - 1.5 and blur["ssim"] > noise["ssim"]
    assert blur["texture"] < noise["texture"] - 0.15
    assert blur["texture_walls"] < noise["texture_walls"] - 0.2
    # relative losses: PSNR from the noisy frame's level, texture from 1
    assert (1 - blur["texture"]) > 10 * abs(noise["psnr"] - blur["psnr"]) / noise["psnr"]


def test_masks_full_empty_and_on_walls():
    g = torch.Generator().manual_seed(3)
    a, b = torch.rand(4, 3, 24, 24, generator=g), torch.rand(4, 3, 24, 24, generator=g)
    full = torch.ones(4, 24, 24, dtype=torch.bool)
    empty = torch.zeros(4, 24, 24, dtype=torch.bool)
    torch.testing.assert_close(psnr(a, b, full), psnr(a, b), rtol=0, atol=1e-4)
    torch.testing.assert_close(ssim(a, b, full), ssim(a, b), rtol=0, atol=1e-5)
    torch.testing.assert_close(texture(a, b, full), texture(a, b), rtol=0, atol=1e-6)
    for f in (psnr, ssim, texture):
        out = f(a, b, empty)
        assert out.dtype == torch.float32 and out.shape == (4,) and out.isnan().all(), f
    # a mask on some frames only: NaN there, numbers elsewhere
    some = full.clone()
    some[1] = False
    assert psnr(a, b, some).isnan().tolist() == [False, True, False, False]
    surface = torch.full((2, 8, 8), SURFACES.index("floor"), dtype=torch.uint8)
    surface[0, 2:5] = SURFACES.index("wall")
    assert wall_mask(surface).sum().item() == 24 and wall_mask(surface.numpy()).dtype == torch.bool


def test_unmasked_figures_are_evaluations_own():
    from torchmetrics.functional.image import peak_signal_noise_ratio as tm_psnr
    from torchmetrics.functional.image import structural_similarity_index_measure as tm_ssim

    g = torch.Generator().manual_seed(4)
    a = torch.rand(5, 3, 64, 64, generator=g)
    b = (a + 0.2 * torch.rand(5, 3, 64, 64, generator=g)).clamp(0, 1)
    ref = tm_psnr(b, a, data_range=1.0, reduction="none", dim=(1, 2, 3))
    assert torch.equal(psnr(b, a), ref) and (psnr(a, a) == 100).all()
    assert torch.equal(ssim(b, a), tm_ssim(b, a, data_range=1.0, reduction="none"))
    # the separable SSIM map that score_frames uses is torchmetrics' map, to rounding
    _, tm_map = tm_ssim(b, a, data_range=1.0, reduction="none", return_full_image=True)
    torch.testing.assert_close(ssim_map(b, a), tm_map, rtol=0, atol=2e-5)


def test_texture_is_symmetric_and_one_only_for_equal_frames():
    g = torch.Generator().manual_seed(5)
    a = gaussian_blur(torch.rand(3, 3, 48, 48, generator=g), 0.7)
    b = a + 0.03 * torch.randn(a.shape, generator=g)
    assert (texture(a, a) == 1).all()
    assert (texture(b, a) < 0.99).all() and (texture(b, a) > 0.5).all()
    torch.testing.assert_close(texture(a, b), texture(b, a), rtol=0, atol=1e-5)
    # detail scaled by s scores 2s / (1 + s²), whether too weak or too strong
    slow = gaussian_blur(a, 8.0)
    for s in (0.5, 2.0):
        torch.testing.assert_close(
            texture(slow + s * (a - slow), a),
            torch.full((3,), 2 * s / (1 + s * s)),
            atol=0.02,
            rtol=0,
        )
    assert texture(torch.full_like(a, 0.3), a).abs().max() < 1e-6
    assert texture(gaussian_blur(torch.rand(3, 3, 48, 48, generator=g), 0.7), a).abs().max() < 0.06


def test_score_frames(batch):
    truth = as_float(batch["rgb"])
    pred = as_float(blurred(batch["rgb"].numpy()))
    r = score_frames(pred, truth, batch["surface"])
    assert list(r) == list(METRICS)
    assert all(v.dtype == np.float32 and v.shape == (len(truth),) for v in r.values())
    np.testing.assert_array_equal(r["psnr"], psnr(pred, truth).numpy())
    np.testing.assert_allclose(r["ssim"], ssim(pred, truth).numpy(), atol=1e-5)
    walls = wall_mask(batch["surface"])
    np.testing.assert_allclose(r["texture_walls"], texture(pred, truth, walls).numpy(), atol=1e-6)
    np.testing.assert_allclose(r["ssim_walls"], ssim(pred, truth, walls).numpy(), atol=1e-6)
    # a frame with no wall scores NaN on the walls and a number on the whole frame
    no_walls = batch["surface"].clone()
    no_walls[0][no_walls[0] == SURFACES.index("wall")] = SURFACES.index("floor")
    r0 = score_frames(pred, truth, no_walls)
    assert all(np.isnan(r0[m][0]) and np.isfinite(r0[m][1:]).all() for m in METRICS[1::2])
    assert all(np.isfinite(r0[m]).all() for m in METRICS[::2])
    assert all(v.shape == (0,) for v in score_frames(pred[:0], truth[:0], walls[:0]).values())
    with pytest.raises(ValueError, match="frames to score must match"):
        score_frames(pred[:2], truth, batch["surface"])


def test_distortions_are_what_they_say(batch):
    d = distortions(batch)
    rgb = batch["rgb"].numpy()
    assert list(d) == list(DISTORTIONS)
    assert all(v.dtype == np.uint8 and v.shape == rgb.shape for v in d.values())
    np.testing.assert_array_equal(d["truth"], rgb)
    np.testing.assert_array_equal(d["shifted"][:, :, 1:], rgb[:, :, :-1])
    np.testing.assert_array_equal(d["shifted"][:, :, 0], rgb[:, :, 0])
    np.testing.assert_array_equal(d["noisy"], distortions(batch)["noisy"])  # seeded
    assert not np.array_equal(d["noisy"], distortions(batch, seed=1)["noisy"])
    noise = d["noisy"].astype(float) - rgb
    assert 6 < noise[(rgb > 30) & (rgb < 225)].std() < 9
    # flat: one colour per surface of each frame
    surf = batch["surface"].numpy()
    for c in np.unique(surf[0]):
        assert len(np.unique(d["flat"][0][surf[0] == c], axis=0)) == 1
    # the wrong theme is the next theme's skin of the same channels: its walls differ
    assert (d["wrong theme"] != rgb).any(axis=-1)[surf == SURFACES.index("wall")].mean() > 0.5
