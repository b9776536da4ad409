"""Engine checks a notebook can't hold: golden hashes, fresh processes and pools, long episodes,
memory, exact-table robustness, the command line. The examples in nbs/10_engine, 11_episode and
12_game cover the rest."""

import functools
import math
import multiprocessing as mp
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from qmind_render.world import engine as E
from qmind_render.world import episode as EP
from qmind_render.world import game as G
from qmind_render.contracts import load_spec, validate

SPEC = load_spec()
SID = {c: SPEC.surface_id(c) for c in SPEC.classes}
FRAME_BYTES = sum(SPEC.dtype(c).itemsize * int(np.prod(SPEC.shape(c))) for c in SPEC.names)
# what the engine's buffers hold per frame besides the channels: the z-buffer (float32), the pose
# and each column's wall distance (float64)
GEOMETRY_BYTES = 4 * SPEC.size[0] * SPEC.size[1] + 3 * 8 + 8 * SPEC.size[1]
hashes = functools.partial(EP.episode_hashes, n_frames=24)


def digest(seed, materials=None):
    return EP.episode_hashes(seed, 24, materials)["all"]


# --- determinism ---------------------------------------------------------------------------


def test_goldens_match():
    "Any change to what the engine emits fails here until the goldens are regenerated on purpose."
    diffs = EP.check_goldens()
    assert not diffs, (
        "engine output differs from tests/golden/engine_hashes.json:\n  "
        + "\n  ".join(diffs)
        + "\nIf the change is intended: bump ENGINE_VERSION, then python -m "
        "qmind_render.world.episode --regen-goldens"
    )


def test_goldens_file_records_versions_and_cases(tmp_path):
    g = __import__("json").loads(EP.default_golden_path().read_text())
    assert (
        g["engine_version"] == E.ENGINE_VERSION
        and g["channel_spec"] == SPEC.version
        and g["size"] == list(SPEC.size)
    )
    assert [(c["seed"], c["frames"], c["materials"]) for c in g["cases"]] == [
        (s, n, list(m) if m else None) for s, n, m in EP.GOLDEN_CASES
    ]
    # a changed hash under the same version is refused unless forced
    bad = dict(
        g,
        cases=[dict(g["cases"][0], sha256=dict(g["cases"][0]["sha256"], all="0" * 64))]
        + g["cases"][1:],
    )
    p = tmp_path / "g.json"
    p.write_text(__import__("json").dumps(bad))
    assert any("seed 0" in d for d in EP.check_goldens(p))
    with pytest.raises(ValueError, match="bump"):
        EP.regen_goldens(p)
    EP.regen_goldens(p, force=True)
    assert EP.check_goldens(p) == []


def test_same_seed_same_bytes_in_process():
    a, b = hashes(1003), hashes(1003)
    assert a == b
    assert hashes(1004)["all"] != a["all"]
    assert digest(7, [2]) != digest(7)


def test_same_bytes_across_fresh_processes():
    code = (
        "from qmind_render.world.episode import episode_hashes; "
        "print(episode_hashes(1003, 24)['all'])"
    )
    outs = []
    for hs in ("0", "12345"):  # different str-hash salts: nothing may depend on set or dict order
        env = {**os.environ, "PYTHONHASHSEED": hs}
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
        )
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout.strip())
    assert outs == [digest(1003)] * 2


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_same_bytes_in_a_pool(method):
    seeds = [0, 1, 1003, 0]
    with mp.get_context(method).Pool(2) as pool:
        got = pool.map(hashes, seeds)
    assert [h["all"] for h in got] == [digest(s) for s in seeds]


def test_frames_do_not_depend_on_chunking():
    """A frame depends on its seed and index only: prefixes agree, and Game steps give the same
    frames."""
    long = list(EP.render_episode(5, 2 * EP.CHUNK + 3))
    short = list(EP.render_episode(5, EP.CHUNK - 1))
    game = G.Game(5)
    for a, b in zip(short, long):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    for f in long:
        assert all(np.array_equal(v, f[k]) for k, v in game.step().items())


def test_replaying_recorded_actions_gives_the_same_frames():
    g, acts, frames = G.Game(9), [], []
    for _ in range(60):
        frames.append(g.step())
        acts.append(g.last_action)
    r = G.Game(9)
    for a, f in zip(acts, frames):
        assert all(np.array_equal(v, f[k]) for k, v in r.step(a).items())


# --- portability of the exact tables ---------------------------------------------------------


def test_heading_table_survives_one_ulp_of_libm_error():
    t = E.heading_table()
    for k in range(E.N_HEADINGS):
        a = 2 * math.pi * k / E.N_HEADINGS
        for fn, col in ((math.cos, 0), (math.sin, 1)):
            for x in (np.nextafter(fn(a), np.inf), np.nextafter(fn(a), -np.inf)):
                assert round(float(x) * 2**30) / 2**30 == t[k, col]


def test_depth_table_survives_libm_error():
    bits = E.depth_table(32.0)
    x = np.array([math.log1p(k / E.DEPTH_Q) / math.log1p(32.0) for k in range(len(bits))])
    assert x[0] == 0.0 and bits[0] == 0  # log1p(0) is exactly 0 by the C standard
    for wiggle in (
        np.nextafter(x, np.inf),
        np.nextafter(x, -np.inf),
        np.nextafter(np.nextafter(x, np.inf), np.inf),
    ):
        assert np.array_equal(wiggle[1:].astype(np.float16).view(np.uint16), bits[1:])


def _kernels():
    from numba.core.registry import CPUDispatcher

    return {k: v for k, v in vars(E).items() if isinstance(v, CPUDispatcher)}


def test_no_kernel_uses_fastmath():
    ks = _kernels()
    assert {"_run", "_draw_all", "_column", "_cast", "_draw_sprite", "_policy"} <= set(ks)
    assert [k for k, f in ks.items() if f.targetoptions.get("fastmath")] == []


def test_the_stage_is_three_modules_and_every_kernel_is_in_engine():
    """numba caches per source file and misses a changed callee in another file: all kernels stay in
    engine.py."""
    from numba.core.registry import CPUDispatcher

    for mod in (EP, G):
        assert not [
            k
            for k, v in vars(mod).items()
            if isinstance(v, CPUDispatcher) and v.py_func.__module__ == mod.__name__
        ]
    assert {
        "render_episode",
        "render_batch",
        "make_world",
        "bench_engine",
        "episode_hashes",
    } <= set(EP.__all__)
    assert {"Game", "plot_map", "render_main"} <= set(G.__all__)
    # one home per name
    assert not {"render_episode", "Game", "make_world", "plot_map", "bench_engine"} & set(vars(E))


_ASM_CHECK = """
import sys
from numba.core.registry import CPUDispatcher
import qmind_render.world.engine as E
from qmind_render.world.episode import make_world, render_episode
list(render_episode(0, 2)); E.render_world(make_world(0))
bad = [k for k, f in vars(E).items() if isinstance(f, CPUDispatcher)
       for sig in f.signatures if any(op in f.inspect_asm(sig).lower() for op in ("vfmadd", "vfnmadd", "vfmsub"))]
print("FMA in:", bad) if bad else print("no FMA")
sys.exit(1 if bad else 0)
"""  # noqa: E501 (a script run in a fresh process)


def test_compiled_kernels_have_no_fused_multiply_add(tmp_path):
    """The machine code itself: a*b+c must stay two roundings (an FMA would give other bits on other
    CPUs)."""
    # compile afresh: numba can't inspect cached code
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-c", _ASM_CHECK], capture_output=True, text=True, env=env, timeout=600
    )
    assert r.returncode == 0 and "no FMA" in r.stdout, r.stdout + r.stderr


# --- the contract --------------------------------------------------------------------------


def test_every_frame_of_several_episodes_validates():
    seen = set()
    for seed in (0, 5, 99):
        for f in EP.render_episode(seed, 300):
            validate(f, SPEC)
            seen |= set(np.unique(f["surface"]).tolist())
    assert seen == set(SID.values())  # ceiling, wall, floor and enemy all appear


def test_other_sizes_validate():
    for size in ((8, 8), (40, 72), (120, 160)):
        spec = __import__("dataclasses").replace(SPEC, size=size)
        for f in EP.render_episode(3, 10, spec=spec):
            validate(f, spec)


def test_batch_frames_validate_and_equal_single_episodes():
    seeds = [3, 1, 4, 1]
    singles = [list(EP.render_episode(s, 30)) for s in seeds]
    for t, fb in enumerate(EP.render_batch(seeds, 30)):
        validate(fb, SPEC, batch=True)
        for b in range(len(seeds)):
            assert all(np.array_equal(fb[k][b], singles[b][t][k]) for k in fb)


def test_materials_restrict_the_walls():
    for mats in ([0], [1, 3], [4, 2, 4]):
        shown = set()
        for seed in range(4):
            for f in EP.render_episode(seed, 100, materials=mats):
                shown |= set(np.unique(f["material"][f["surface"] == SID["wall"]]).tolist())
        assert shown == set(mats), (mats, shown)  # only those, and each of them is seen


def test_depth_is_perpendicular_and_stored_as_the_spec_says():
    """Facing a flat wall 7.5 cells ahead: one depth across the columns (no fisheye),
    log1p(7.5)/log1p(32)."""
    room = E.World.from_ascii("""
        ##########
        #........#
        #........#
        #P.......#
        #........#
        #........#
        ##########
    """)
    f = E.render_world(room)
    row = f["depth"][32, 20:44].astype(np.float64)
    assert (f["surface"][32, 20:44] == SID["wall"]).all()
    du = np.diff(f["uv"][32, 20:44, 0].astype(np.float64))
    # u runs left to right, wrapping at cell edges
    assert ((du > 0) | (du < -0.5)).all() and (du < -0.5).sum() >= 1
    assert np.all(row == row[0])
    assert abs(row[0] - math.log1p(7.5) / math.log1p(32.0)) < 1e-3
    col = f["uv"][:, 32, 1].astype(np.float64)[f["surface"][:, 32] == SID["wall"]]
    assert np.all(np.diff(col) < 0) and col[0] > 0.8 and col[-1] < 0.2  # v runs up the wall
    # the floor seen by pixel (50, 32), facing +x from (1.5, 3.5)
    r, camx = 24 / (50.5 - 32), 1 / 64
    wx, wy = 1.5 + r, 3.5 + r * (2 / 3) * camx
    assert f["surface"][50, 32] == SID["floor"]
    # world-space fractions
    assert np.allclose(f["uv"][50, 32].astype(np.float64), [wx % 1, wy % 1], atol=1e-3)
    floor = f["surface"][:, 32] == SID["floor"]
    # nearer floor is brighter
    assert np.all(np.diff(f["light"][floor, 32].astype(np.float64)) >= 0)


# --- occlusion -----------------------------------------------------------------------------


def test_a_wall_hides_an_enemy_behind_it():
    open_ = E.World.from_ascii("""
        ##########
        #P......E#
        #........#
        ##########
    """)
    walled = E.World.from_ascii("""
        ##########
        #P...1..E#
        #........#
        ##########
    """)
    assert (E.render_world(open_)["surface"] == SID["enemy"]).sum() > 5
    assert (E.render_world(walled)["surface"] == SID["enemy"]).sum() == 0


def test_the_nearer_enemy_hides_the_farther():
    w = E.World.from_ascii("""
        ##########
        #P..E..E.#
        ##########
    """)
    f = E.render_world(w)
    assert f["surface"][32, 32] == SID["enemy"]
    assert abs(float(f["depth"][32, 32]) - math.log1p(3.0) / math.log1p(32.0)) < 1e-3
    w2 = E.World.from_ascii("""
        ##########
        #P.....E.#
        ##########
    """)
    assert (
        abs(float(E.render_world(w2)["depth"][32, 32]) - math.log1p(6.0) / math.log1p(32.0)) < 1e-3
    )


# --- the policy ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_the_policy_walks_without_getting_stuck(seed):
    g, cells, still, longest, walked = G.Game(seed), set(), 0, 0, 0.0
    for _ in range(1000):
        x0, y0, _ = g.player
        g.step()
        x, y, _ = g.player
        walked += math.hypot(x - x0, y - y0)
        still = still + 1 if (x, y) == (x0, y0) else 0
        longest = max(longest, still)
        cells.add((int(x), int(y)))
        assert g._runner.state.grid[0, int(y), int(x)] == E.OPEN
    assert len(cells) >= 30 and walked > 40 and longest < 60, (len(cells), walked, longest)


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call,name",
    [
        (lambda: EP.render_episode(-1, 5), "seed"),
        (lambda: EP.render_episode(1.5, 5), "seed"),
        (lambda: EP.render_episode(True, 5), "seed"),
        (lambda: EP.render_episode("3", 5), "seed"),
        (lambda: EP.render_episode(1, -5), "n_frames"),
        (lambda: EP.render_episode(1, 2.0), "n_frames"),
        (lambda: EP.render_episode(1, 5, materials=[]), "materials"),
        (lambda: EP.render_episode(1, 5, materials=[5]), "materials"),
        (lambda: EP.render_episode(1, 5, materials=[1.0]), "materials"),
        (lambda: EP.render_episode(1, 5, materials="0"), "materials"),
        (
            lambda: EP.render_episode(
                1, 5, spec=__import__("dataclasses").replace(SPEC, size=(4, 4))
            ),
            "spec",
        ),
        (
            lambda: EP.render_episode(
                1, 5, spec=__import__("dataclasses").replace(SPEC, size=(64, 2048))
            ),
            "spec",
        ),
        (lambda: EP.render_batch([], 5), "seeds"),
        (lambda: EP.render_batch([1, -1], 5), "seeds"),
        (lambda: EP.render_batch(7, 5), "seeds"),
        (lambda: G.Game(0).step("jump"), "action"),
        (lambda: G.Game(0).step(7), "action"),
        (lambda: G.Game(0).step(True), "action"),
        (lambda: EP.bench_engine(frames=0), "frames"),
    ],
)
def test_bad_input_is_a_value_error_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_bad_input_fails_at_the_call_not_at_the_first_frame():
    with pytest.raises(ValueError):
        EP.render_episode(-1, 5)  # no next() needed


# --- memory --------------------------------------------------------------------------------


def test_a_long_episode_holds_only_a_few_frames():
    tracemalloc.start()
    try:
        for _ in EP.render_episode(2, 1000):
            pass
        _, streaming = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        kept = list(EP.render_episode(2, 200))
        _, hoarding = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # a chunk (or two) of frames, not 1,000
    assert streaming < 3 * EP.CHUNK * (FRAME_BYTES + GEOMETRY_BYTES), streaming
    # the measurement sees frames that are kept
    assert hoarding > 150 * FRAME_BYTES and len(kept) == 200


# --- pictures and the command line ---------------------------------------------------------


def test_render_main_writes_pngs(tmp_path):
    from PIL import Image

    out = tmp_path / "render"
    assert G.render_main(["--seed", "2", "--frames", "5", "--out", str(out), "--scale", "2"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == [f"frame_{t:05d}.png" for t in range(5)] + ["map.png"]
    im = Image.open(out / "frame_00003.png")
    assert im.size == (6 * 128 + 5 * 2, 14 + 128) and im.mode == "RGB"
    assert len(np.unique(np.asarray(im).reshape(-1, 3), axis=0)) > 20  # a picture, not a blank
    assert Image.open(out / "map.png").size[0] > 100


def test_render_main_reports_bad_arguments(tmp_path, capsys):
    assert G.render_main(["--seed", "-1", "--out", str(tmp_path)]) == 2
    assert "seed" in capsys.readouterr().err
    assert G.render_main(["--frames", "0", "--out", str(tmp_path)]) == 2
    assert G.render_main(["--seed", "x", "--out", str(tmp_path)]) == 2  # argparse's own error
    assert G.render_main(["--out"]) == 2
    assert G.render_main(["--help"]) == 0


def test_bench_engine_reports_numbers():
    r = EP.bench_engine(frames=64, repeats=2, batch=4)
    assert r["size"] == list(SPEC.size) and r["engine_version"] == E.ENGINE_VERSION
    for k in ("single", "batched"):
        assert r[k]["frames_per_s"] > 0 and len(r[k]["runs_frames_per_s"]) == 2
        assert r[k]["pixels_per_s"] == pytest.approx(r[k]["frames_per_s"] * 64 * 64, rel=1e-3)
    assert r["batched"]["batch"] == 4 and r["machine"]["cpu_count"] >= 1


def test_module_entry_point_checks_goldens():
    r = subprocess.run(
        [sys.executable, "-m", "qmind_render.world.episode", "--check-goldens"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(E.__file__).parents[1],
    )
    assert r.returncode == 0 and "goldens agree" in r.stdout, r.stdout + r.stderr
