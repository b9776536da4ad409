"""Temporal stability: the camera under the contract, exact reprojection on engine walks, and the
serve path's starting noise (`nbs/core/58_temporal.ipynb` holds the known answers as examples)."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from qmind_render.contracts import contracts_dir, load_spec
from qmind_render.world.episode import render_episode, render_walk
from qmind_render.world.grid import load_grid
from qmind_render.world.skinner import skin
from qmind_render.core.metrics import blurred, noisy, wall_mask
from qmind_render.core.temporal import (
    per_walk_difference,
    plane_ids,
    pooled_difference,
    pooled_error,
    reprojection,
    temporal_difference,
    temporal_excess,
    warp_error,
    world_noise,
    world_points,
)

SPEC, GRID = load_spec(), load_grid()


def spec_with(tmp_path: Path, old: str, new: str) -> Path:
    text = (contracts_dir() / "channel_spec.yaml").read_text()
    assert old in text
    p = tmp_path / "channel_spec.yaml"
    p.write_text(text.replace(old, new))
    return p


def test_the_camera_is_under_the_contract(tmp_path):
    assert SPEC.version == "0.1.1"
    assert SPEC.camera["headings"] == 512 and SPEC.camera["eye"] == 0.5
    with pytest.raises(ValueError, match=r"camera `plane` must be a positive number"):
        load_spec(spec_with(tmp_path, "plane: 0.6666666666666666", "plane: -1"))
    (tmp_path / "b").mkdir()
    with pytest.raises(ValueError, match=r"`camera` must be a mapping"):
        load_spec(spec_with(tmp_path / "b", "camera:  ", "camera_gone:  "))
    # a camera the engine does not draw with is refused before any frame is made
    wide = dataclasses.replace(SPEC, camera={**SPEC.camera, "plane": 1.0})
    with pytest.raises(ValueError, match=r"spec camera .* the engine draws with"):
        next(render_episode(0, 1, spec=wide))


def test_reprojection_is_exact_where_both_frames_saw_the_point():
    # a walk that moves and turns: the policy's
    walk = render_walk(5, 32)
    rep = reprojection(walk)
    T = len(walk.pose)
    uv = walk.channels["uv"].astype(np.float32)
    # each pixel's previous texture coordinates, sampled where it landed, are its own
    # (within 4 cells, where a pixel spans far less than a cell, and away from where they wrap):
    # exact up to the engine's 1/1024 quantisation and the interpolation
    prev = np.einsum(
        "tpk,tpkc->tpc",
        rep.weights,
        uv.reshape(T, -1, 2)[:-1][np.arange(T - 1)[:, None, None], rep.taps],
    )
    cur = uv[1:].reshape(T - 1, -1, 2)
    near = walk.zbuf[1:].reshape(T - 1, -1) < 4
    inner = rep.valid & near & (np.abs(cur - 0.5) < 0.4).all(-1)
    assert inner.mean() > 0.2
    err = np.abs(prev - cur)[inner]
    assert np.median(err) < 1e-3 and np.percentile(err, 99) < 0.02
    # planes: the floor at height 0, the ceiling at 1, enemies never compared
    surf = walk.channels["surface"]
    pts = world_points(walk.zbuf[3], walk.pose[3])
    ids = plane_ids(pts, surf[3])
    assert (ids[surf[3] == SPEC.surface_id("floor")] == 0).all()
    assert not rep.valid.reshape(T - 1, *SPEC.size)[surf[1:] == SPEC.surface_id("enemy")].any()


def test_the_metric_on_known_answers():
    walk = render_walk(9, 20)
    rep = reprojection(walk)
    truth = skin(walk.channels, GRID.themes[2], GRID.lightings[1])
    assert temporal_excess(truth, truth, rep)["excess"] == 0
    assert pooled_error([truth], [rep]) == pytest.approx(warp_error(truth, rep)["rms"], rel=1e-6)
    # a still player: the truth does not change at all
    still = render_walk(9, 5, actions=[0] * 5)
    still_truth = skin(still.channels, GRID.themes[2], GRID.lightings[1])
    assert warp_error(still_truth, reprojection(still))["rms"] < 1e-3
    # noise drawn afresh every frame flickers; the same noise frozen onto the world does not
    rng = np.random.default_rng(1)
    fresh = np.clip(truth + 20 * rng.standard_normal(truth.shape), 0, 255).astype(np.uint8)
    noise = np.stack(
        [
            world_noise(
                walk.zbuf[t], walk.pose[t], walk.channels["surface"][t], walk.channels["uv"][t]
            )
            for t in range(len(walk.pose))
        ]
    ).transpose(0, 2, 3, 1)
    frozen = np.clip(truth + 20 * noise, 0, 255).astype(np.uint8)
    fresh_x = temporal_excess(fresh, truth, rep)["excess"]
    frozen_x = temporal_excess(frozen, truth, rep)["excess"]
    assert fresh_x > 8 and frozen_x < fresh_x / 3, (fresh_x, frozen_x)
    # frames that jump by a pixel every other frame are caught
    jitter = truth.copy()
    jitter[1::2] = np.roll(truth[1::2], 1, axis=2)
    assert temporal_excess(jitter, truth, rep)["excess"] > 3


def test_the_temporal_difference_charges_blur_that_the_warping_error_rewards():
    """TecoGAN's tOF form: the model's change from frame to frame against the truth's. The truth
    scores 0; a blurred truth changes less than the truth (the old figure calls it steadier) and
    is charged; noise costs about 8√2 levels less clipping; a frozen picture costs most."""
    walk = render_walk(9, 20)
    rep = reprojection(walk)
    truth = skin(walk.channels, GRID.themes[2], GRID.lightings[1])
    blur = blurred(truth)
    assert temporal_difference(truth, truth, rep) == 0
    assert warp_error(blur, rep)["rms"] < warp_error(truth, rep)["rms"]
    d_blur = temporal_difference(blur, truth, rep)
    assert 5 < d_blur < 25, d_blur
    d_noise = temporal_difference(noisy(truth, 8.0), truth, rep)
    assert 6 < d_noise < 12, d_noise
    frozen = np.repeat(truth[:1], len(truth), axis=0)
    assert temporal_difference(frozen, truth, rep) > max(d_blur, d_noise)
    # on the walls alone, and pooled over walks as their pixels weigh
    walls = wall_mask(walk.channels["surface"]).numpy()
    assert 0 < temporal_difference(blur, truth, rep, walls) < d_blur * 1.5
    nowhere = np.zeros_like(walls)
    assert np.isnan(temporal_difference(blur, truth, rep, nowhere))
    walk2 = render_walk(10, 12)
    rep2 = reprojection(walk2)
    truth2 = skin(walk2.channels, GRID.themes[0], GRID.lightings[2])
    walks, truths, reps = [blur, blurred(truth2)], [truth, truth2], [rep, rep2]
    per = per_walk_difference(walks, truths, reps)
    pooled = pooled_difference(walks, truths, reps)
    assert per[0] == pytest.approx(d_blur) and min(per) <= pooled <= max(per)
    assert pooled_difference(walks, truths, reps, [walls, None]) > 0
    with pytest.raises(ValueError, match=r"mask must be bool \[T, H, W\]"):
        temporal_difference(blur, truth, rep, walls[1:])
    with pytest.raises(ValueError, match="a walk and its truth must match"):
        temporal_difference(blur[1:], truth, rep)


def test_world_noise_is_standard_normal_and_a_function_of_the_geometry():
    walk = render_walk(2, 4)
    args = (walk.zbuf[2], walk.pose[2], walk.channels["surface"][2], walk.channels["uv"][2])
    z = world_noise(*args, texels=64)
    assert z.shape == (3, *SPEC.size) and z.dtype == np.float32
    assert abs(z.mean()) < 0.1 and abs(z.std() - 1) < 0.1
    np.testing.assert_array_equal(z, world_noise(*args, texels=64))
    other = world_noise(*args, seed=7, texels=64)
    assert abs(np.corrcoef(z.ravel(), other.ravel())[0, 1]) < 0.05


def test_play_sessions_carry_world_noise_and_the_bench_measures_it():
    from qmind_render.serve.app import PlaySession
    from qmind_render.serve.renderer import ServeError
    from qmind_render.serve.serve_bench import bench_temporal
    from qmind_render.serve.settings import ServeSettings

    world = PlaySession(3, 0, 0, 1, noise="world")
    item, _, _ = world.step({"action": "forward"}, GRID, SPEC)
    assert item.noise.shape == (3, *SPEC.size)
    screen = PlaySession(3, 0, 0, 1, noise="screen")
    assert screen.step({"action": "forward"}, GRID, SPEC)[0].noise is None
    assert ServeSettings().noise == "world"
    with pytest.raises(ServeError, match="noise 'film' is not one of world, screen"):
        ServeSettings(noise="film")
    r = bench_temporal(walks=1, frames=4, steps=[2], noise=["screen", "world"])
    for mode in ("screen", "world"):
        assert 5 < r[f"{mode}_steps2_psnr"] < 60
        assert r[f"{mode}_steps2_excess"] == pytest.approx(
            r[f"{mode}_steps2_rms"] - r["truth_rms"], abs=2e-3
        )
