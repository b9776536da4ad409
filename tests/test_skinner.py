"""The skinner (nbs/world/20_skinner.ipynb) and its factor cells (nbs/world/21_cells.ipynb):
determinism (in process, in fresh processes, compiled vs plain Python), golden bytes, seamless
wrap, all 100 cells distinct, refusals that name the field, and the exact factor cells of a frame.
Each property test is paired with a check that it fails on a broken skinner, so a test that passes
means something.

Regenerate the golden hashes after an intended change of skinned bytes (and a SKINNER_VERSION bump):
    python tests/test_skinner.py --update-golden
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from qmind_render.world import cells as cl
from qmind_render.world import explorer as ex
from qmind_render.world import skinner as sk
from qmind_render.contracts import ChannelError, ThemeError
from qmind_render.world.grid import LightingError, grid_path, load_grid

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "skinner_hashes.json"
GRID = load_grid()


def golden_inputs() -> dict:
    """Named (channels, theme id, lighting id) whose skinned bytes are pinned. Engine-free on
    purpose."""
    out = {
        f"corridor/{t}/{l}": (sk.corridor_frame(shift=0.3), t, l)
        for t in range(5)
        for l in range(4)
    }
    out["corridor-batch/3/2"] = (
        sk.stack_frames(sk.corridor_frame(shift=0.25 * i) for i in range(8)),
        3,
        2,
    )
    for m in range(5):
        out[f"swatch-{m}/{m}/{m % 4}"] = (
            sk.wall_frame(m, u0=0.8, span=0.6, light=0.6, depth=0.3),
            m,
            m % 4,
        )
    return out


def current_hashes(names=None) -> dict:
    inputs = golden_inputs()
    return {
        k: hashlib.sha256(sk.skin(ch, GRID.theme(t), GRID.lighting(l)).tobytes()).hexdigest()
        for k, (ch, t, l) in inputs.items()
        if names is None or k in names
    }


def _in_subprocess(env_extra: dict, names=None) -> dict:
    env = {**os.environ, **env_extra}
    code = (
        "import json, sys; sys.path.insert(0, 'tests'); import test_skinner as t; "
        f"print(json.dumps(t.current_hashes({names!r})))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# --- determinism --------------------------------------------------------------------------------


def test_same_input_same_bytes_and_batch_equals_frames():
    frames = [
        sk.corridor_frame(shift=0.1 * i, materials=[(i + k) % 5 for k in range(5)])
        for i in range(6)
    ]
    th, li = GRID.theme("temple"), GRID.lighting("moonlight")
    one = np.stack([sk.skin(f, th, li) for f in frames])
    batch = sk.skin_batch(sk.stack_frames(frames), th, li)
    assert one.tobytes() == batch.tobytes()
    assert sk.skin_batch(sk.stack_frames(frames), th, li).tobytes() == batch.tobytes()
    assert len({x.tobytes() for x in one}) == len(frames)  # and the frames do differ


def test_golden_hashes():
    golden = json.loads(GOLDEN.read_text())
    assert (
        golden["skinner_version"] == sk.SKINNER_VERSION and golden["grid_version"] == GRID.version
    ), (
        f"golden hashes are for skinner {golden['skinner_version']} / grid "
        f"{golden['grid_version']}, the code is "
        f"{sk.SKINNER_VERSION} / {GRID.version}: regenerate with `python "
        "tests/test_skinner.py --update-golden`"
    )
    now = current_hashes()
    changed = sorted(k for k in golden["hashes"] if now.get(k) != golden["hashes"][k])
    assert not changed, (
        f"skinned bytes changed for {changed[:5]} (+{max(0, len(changed) - 5)} more) at skinner "
        f"{sk.SKINNER_VERSION}: if intended, bump SKINNER_VERSION and regenerate the golden hashes"
    )
    assert set(now) == set(golden["hashes"])


def test_fresh_process_paints_the_same_bytes():
    assert _in_subprocess({}) == current_hashes()


def test_compiled_kernel_equals_plain_python():
    "NUMBA_DISABLE_JIT runs the very same kernel as Python: IEEE double, no FMA, no reordering."
    names = ["corridor/0/0", "corridor/2/1", "corridor/4/3", "swatch-3/3/3"]
    assert _in_subprocess({"NUMBA_DISABLE_JIT": "1"}, names) == current_hashes(names)


# --- seamless wrap ------------------------------------------------------------------------------


def _set_uv(frame, axis, value):
    uv = frame["uv"].copy()
    uv[..., axis] = value
    return {**frame, "uv": uv}


def _surface_frame(cls: int):
    "A flat frame of one surface class (ceiling or floor) with a uv grid."
    f = sk.wall_frame(0)
    return {
        **f,
        "surface": np.full_like(f["surface"], cls),
        "material": np.full_like(f["material"], 255),
    }


def _wrap_mismatches(themes=range(5)) -> list:
    "Every (theme, surface/material, axis) whose pixels differ between uv = 0 and uv = 1."
    frames = {f"material {m}": sk.wall_frame(m) for m in range(5)}
    frames.update(ceiling=_surface_frame(0), floor=_surface_frame(2))
    bad = []
    for t in themes:
        for name, f in frames.items():
            for axis in (0, 1):
                a = sk.skin(_set_uv(f, axis, 0.0), GRID.theme(t), GRID.lighting(0))
                b = sk.skin(_set_uv(f, axis, 1.0), GRID.theme(t), GRID.lighting(0))
                if a.tobytes() != b.tobytes():
                    bad.append((GRID.theme(t)["name"], name, "uv"[axis]))
    return bad


def test_uv_zero_and_one_paint_the_same_bytes():
    assert _wrap_mismatches() == []


def test_wrap_test_fails_when_cells_do_not_wrap():
    """Plain-Python kernel (NUMBA_DISABLE_JIT) with `_cell` no longer wrapping: u = 1 lands in cell
    P."""
    code = (
        "import sys; sys.path.insert(0, 'tests'); import test_skinner as t; from "
        "qmind_render.world import skinner as sk; "
        "sk._cell = lambda x, P: (int(x), x - int(x)); print(len(t._wrap_mismatches([0])))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "NUMBA_DISABLE_JIT": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout.split()[-1]) > 0


def _seam_gap() -> tuple[float, float]:
    """Mean |pixel difference| across the wrap (u = 1 - d vs u = d) and across u = k/16 -+ d: points
    where, like u = 0, every texel grid and most joints have a border, so a tiling texture looks
    alike at both."""
    d = 2.0**-11  # float16 spacing just below 1
    xs = np.arange(1, 16) / 16
    # pairs of u to compare
    us = np.concatenate([[1 - d, d], np.stack([xs - d, xs + d], 1).ravel()])
    at, elsewhere = [], []
    for t in GRID.themes:
        for m in range(5):
            f = sk.wall_frame(m)
            px = sk.skin_batch(
                sk.stack_frames(_set_uv(f, 0, u) for u in us), t, GRID.lighting(0)
            ).astype(np.int16)
            gaps = np.abs(px[0::2] - px[1::2]).mean(axis=(1, 2, 3))
            at.append(gaps[0])
            elsewhere += gaps[1:].tolist()
    return float(np.mean(at)), float(np.mean(elsewhere))


def test_pixels_either_side_of_the_wrap_are_close():
    at, elsewhere = _seam_gap()
    assert at < 2 * elsewhere, (at, elsewhere)  # measured: 0.38 vs 0.39 levels


def test_seam_test_fails_on_noise_that_does_not_tile(monkeypatch):
    ramp = np.broadcast_to(np.linspace(0, 1, sk._TABLE, dtype=np.float32), (sk._TABLE, sk._TABLE))
    monkeypatch.setattr(sk, "_NOISE", np.ascontiguousarray(ramp + ramp.T) / 2)
    at, elsewhere = _seam_gap()
    assert at > 2 * elsewhere  # measured: 13.9 vs 1.3


# --- all 100 cells distinct ---------------------------------------------------------------------


def _closest(frame) -> float:
    cells, D = cl.cell_distances(frame, GRID)
    assert len(cells) == 100
    return float((D + np.diag(np.full(len(cells), np.inf))).min())


def test_all_cells_distinct_on_the_corridor():
    assert _closest(sk.corridor_frame(shift=0.3)) > cl.MIN_CELL_DISTANCE


def test_all_cells_distinct_on_an_engine_frame():
    pytest.importorskip("qmind_render.world.episode")
    assert _closest(sk.engine_frame(11, 5)) > 8.0


def test_distinctness_test_fails_when_lighting_is_ignored(monkeypatch):
    real, day = sk.skin_params, GRID.lighting(0)
    monkeypatch.setattr(sk, "skin_params", lambda theme, lighting: real(theme, day))
    assert _closest(sk.corridor_frame(shift=0.3)) <= cl.MIN_CELL_DISTANCE


# --- refusals -----------------------------------------------------------------------------------


def _grid_with(tmp_path, edit) -> Path:
    d = yaml.safe_load(grid_path().read_text())
    edit(d)
    p = tmp_path / "grid.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _set(path):
    """An edit that sets a dotted path (ints index lists) to a value, or deletes it when value is
    ...."""

    def edit_with(value):
        def edit(d):
            *head, last = path
            for k in head:
                d = d[k]
            if value is ...:
                del d[last]
            else:
                d[last] = value

        return edit

    return edit_with


@pytest.mark.parametrize(
    "path, value, error, field",
    [
        (
            ("themes", 1, "palette", "materials", 3, "accent", 1),
            300,
            ThemeError,
            "palette.materials[3].accent[1]",
        ),
        (("themes", 0, "pattern", "scale"), 0.1, ThemeError, "pattern.scale"),
        (("themes", 4, "palette", "ceiling"), [1, 2], ThemeError, "palette.ceiling"),
        (("themes", 2, "name"), "Hell Level", ThemeError, "name"),
        (("lighting", 0, "temperature"), 500, LightingError, "temperature"),
        (("lighting", 2, "fog", "colour"), [0, 0, -1], LightingError, "fog.colour[2]"),
        (("lighting", 3, "glow"), 1.0, LightingError, "<record>"),
    ],
)
def test_malformed_record_is_refused_naming_the_field(tmp_path, path, value, error, field):
    with pytest.raises(error) as e:
        load_grid(_grid_with(tmp_path, _set(path)(value)))
    assert e.value.field == field and f"field '{field}'" in str(e.value)


def test_missing_lighting_field_is_named(tmp_path):
    with pytest.raises(LightingError, match="'falloff' is a required property"):
        load_grid(_grid_with(tmp_path, _set(("lighting", 1, "falloff"))(...)))


def test_skin_refuses_malformed_records_and_channels():
    f, th, li = sk.corridor_frame(), GRID.theme(0), GRID.lighting(0)
    with pytest.raises(ThemeError, match="pattern.noise"):
        sk.skin(f, {**th, "pattern": {**th["pattern"], "noise": -1}}, li)
    with pytest.raises(LightingError, match="ambient"):
        sk.skin(f, th, {**li, "ambient": 2})
    for name, bad, rule in [
        ("uv", f["uv"].astype(np.float32), "dtype"),
        ("light", np.where(f["surface"] == 0, np.float16(np.nan), f["light"]), "finite"),
        ("depth", (f["depth"] + np.float16(1.5)).astype(np.float16), "range"),
        ("surface", np.where(f["surface"] == 3, 7, f["surface"]).astype(np.uint8), "class set"),
        (
            "material",
            np.where(f["surface"] == 1, 255, f["material"]).astype(np.uint8),
            "applies_to",
        ),
        ("material", f["material"][:32], "shape"),
    ]:
        with pytest.raises(ChannelError) as e:
            sk.skin({**f, name: bad}, th, li)
        assert (e.value.channel, e.value.rule) == (name, rule), str(e.value)


# --- factor cells -------------------------------------------------------------------------------


def test_frame_cells_exact_on_known_materials():
    f = cl.with_material(sk.corridor_frame(materials=(0,)), 2)
    walls = np.argwhere(f["surface"] == 1)
    f["material"][tuple(walls[7])] = 4  # a single pixel of metal
    assert cl.frame_cells(f, 3, 1) == ((3, 2, 1), (3, 4, 1))
    f["material"][tuple(walls[7])] = 2
    assert cl.frame_cells(f, 3, 1) == ((3, 2, 1),)
    enemy_only = {
        **f,
        "surface": np.where(f["surface"] == 1, 0, f["surface"]).astype(np.uint8),
        "material": np.full_like(f["material"], 255),
    }
    assert cl.frame_cells(enemy_only, 0, 0) == ()


def test_frame_cells_batch_and_mask_agree_with_frames():
    frames = [sk.corridor_frame(materials=ms) for ms in [(0,), (1, 3), (0, 1, 2, 3, 4), (4, 4, 2)]]
    t, l = [0, 1, 2, 4], [3, 2, 1, 0]
    batch = sk.stack_frames(frames)
    per_frame = [cl.frame_cells(f, ti, li) for f, ti, li in zip(frames, t, l)]
    assert cl.frame_cells_batch(batch, t, l) == per_frame
    assert per_frame[1] == ((1, 1, 2), (1, 3, 2)) and len(per_frame[2]) == 5
    mask = cl.cell_mask(batch, t, l)
    assert [tuple(GRID.cells()[i] for i in np.flatnonzero(r)) for r in mask] == per_frame


def test_frame_cells_on_engine_frames_match_the_material_channel():
    episode = pytest.importorskip("qmind_render.world.episode")
    for seed in (2, 50):  # one single-material episode, one pair
        frames = sk.stack_frames(
            episode.render_episode(seed, 12, materials=cl.episode_materials(seed))
        )
        for i, cells in enumerate(cl.frame_cells_batch(frames, 1, 2)):
            walls = frames["surface"][i] == 1
            expect = sorted(set(np.unique(frames["material"][i][walls]).tolist()))
            assert [m for _, m, _ in cells] == expect
            assert set(expect) <= set(cl.episode_materials(seed))


# --- the rest of the public API -----------------------------------------------------------------


def test_write_pngs_round_trip(tmp_path):
    from PIL import Image

    frames = [sk.corridor_frame(shift=0.2 * i) for i in range(3)]
    paths = ex.write_pngs(frames, tmp_path, "lab", "toxic")
    assert [p.name for p in paths] == ["frame_00000.png", "frame_00001.png", "frame_00002.png"]
    want = sk.skin(frames[2], GRID.theme("lab"), GRID.lighting("toxic"))
    assert np.array_equal(np.asarray(Image.open(paths[2])), want)


def test_bench_skinner_reports_numbers():
    r = ex.bench_skinner(frames=32, repeats=2)
    assert r["frames_per_s"] > 0 and r["frames"] == 32 and len(r["runs_frames_per_s"]) == 2
    json.dumps(r)  # the CLI prints it as JSON


def test_the_factor_grid_has_its_own_home():
    import qmind_render.world.grid as fg

    moved = {
        "load_grid",
        "FactorGrid",
        "LightingError",
        "validate_lighting",
        "lighting_vector",
        "light_colour",
        "grid_path",
        "LIGHTING_SCHEMA",
    }
    assert moved <= set(fg.__all__) and not moved & set(sk.__all__)  # one home per name


def test_cells_and_explorer_have_their_own_homes():
    "What a frame's cells are (`cells`) and how the skinner is looked at and run (`explorer`)."
    cells = {
        "MIN_CELL_DISTANCE",
        "materials_present",
        "frame_cells",
        "frame_cells_batch",
        "cell_mask",
        "with_material",
        "episode_materials",
        "cell_distances",
    }
    explorer = {
        "explorer_view",
        "explore",
        "cell_grid",
        "swatch_grid",
        "write_pngs",
        "render_main",
        "bench_skinner",
    }
    assert cells <= set(cl.__all__) and explorer <= set(ex.__all__)
    assert not (cells | explorer) & set(sk.__all__)
    assert not cells & set(ex.__all__) and not explorer & set(cl.__all__)


if __name__ == "__main__" and "--update-golden" in sys.argv:
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(
        json.dumps(
            {
                "skinner_version": sk.SKINNER_VERSION,
                "grid_version": GRID.version,
                "hashes": current_hashes(),
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
    print(f"wrote {GOLDEN}")
