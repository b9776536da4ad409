"""The picture stage (nbs/05_viz.ipynb): one palette, read from the channel spec, for every picture
of the channels (the engine's strips and map and the skinner's strips in one `qmind render` output);
a palette change is one edit of the spec; drawing leaves matplotlib's backend and pyplot alone."""

from pathlib import Path

import matplotlib
import numpy as np
import pytest
import yaml
from PIL import Image

from qmind_render.world import engine as E
from qmind_render.world import episode as EP
from qmind_render.world import game as G
from qmind_render.world import explorer as ex
from qmind_render import viz
from qmind_render.contracts import load_spec, random_frame

SPEC = load_spec()


def colours(img: np.ndarray) -> set[tuple[int, int, int]]:
    return {tuple(int(x) for x in c) for c in np.unique(img.reshape(-1, 3), axis=0)}


def test_qmind_render_output_draws_with_one_palette(tmp_path):
    """Engine strips, skinned strips and the map of one `qmind render` run: each class and material
    one colour."""
    out = tmp_path / "r"
    assert (
        ex.render_main(
            ["--seed", "2", "--frames", "1", "--scale", "1", "--out", str(out), "--theme", "lab"]
        )
        == 0
    )
    strip = np.asarray(Image.open(out / "frame_00000.png"))
    skinned = np.asarray(Image.open(out / "skinned" / "frame_00000.png"))
    # the same channels drawn the same way
    assert np.array_equal(skinned[:, : strip.shape[1]], strip)
    f = next(EP.render_episode(2, 1))
    H, W = SPEC.size
    # under the 14-pixel header
    panel = lambda i: strip[14:, i * (W + 2) : i * (W + 2) + W]
    pal = viz.palette()
    for c in np.unique(f["surface"]):
        assert colours(panel(1)[f["surface"] == c]) == {tuple(pal.surface[c])}
    game = G.Game(2)
    game.step()
    st = game._runner.state
    mp = EP.map_image(st.grid[0], st.sector[0], st.light[0])
    shown = [m for m in np.unique(f["material"]) if m != SPEC.material_none]
    assert shown
    # a material: one colour in strip and map
    for m in shown:
        in_strip = colours(panel(2)[f["material"] == m])
        in_map = colours(mp[st.grid[0] == m]) - {(45, 45, 45)}  # hidden rock is dark
        assert in_strip == in_map == {tuple(pal.material[m])}, (m, in_strip, in_map)


def test_palette_change_is_one_edit(tmp_path):
    """Edit one colour in a copy of the channel spec: the strip, the sample grid and the map all
    follow."""
    d = yaml.safe_load((Path(SPEC.path)).read_text())
    d["channels"]["material"]["colours"][3] = [1, 2, 3]
    d["channels"]["surface"]["colours"]["enemy"] = [4, 5, 6]
    p = tmp_path / "channel_spec.yaml"
    p.write_text(yaml.safe_dump(d))
    spec = load_spec(p)
    f = random_frame(spec, np.random.default_rng(0))
    pics = viz.colorize(f, spec)
    assert colours(pics["material"][f["material"] == 3]) == {(1, 2, 3)}
    assert colours(pics["surface"][f["surface"] == spec.surface_id("enemy")]) == {(4, 5, 6)}
    batch = {"surface": f["surface"][None], "rgb": np.zeros((1, *spec.size, 3), np.uint8)}
    assert colours(viz.sample_grid(batch, spec=spec)[: spec.size[0]][f["surface"] == 3]) == {
        (4, 5, 6)
    }
    grid = np.full((4, 4), E.OPEN, np.uint8)
    grid[0] = 3
    mp = EP.map_image(grid, np.zeros((4, 4), np.int32), np.ones(1, np.float32), spec)
    assert colours(mp[0]) == {(1, 2, 3)}
    d["map"]["rock"] = [7, 8, 9]
    d["map"]["floor"] = [[10, 10, 10], [20, 20, 20]]
    p.write_text(yaml.safe_dump(d))
    spec = load_spec(p)
    # a lit room, walls around, rock beyond
    room = np.zeros((6, 6), np.uint8)
    room[1:3, 1:3] = E.OPEN
    mp = EP.map_image(room, np.zeros((6, 6), np.int32), np.ones(1, np.float32), spec)
    # rock and lit floor: the spec's too
    assert colours(mp[5]) == {(7, 8, 9)} and colours(mp[1:3, 1:3]) == {(20, 20, 20)}
    del d["channels"]["material"]["colours"]
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(viz.PaletteError, match="material `colours`"):
        viz.palette(load_spec(p))


def test_map_colours_and_marks_have_one_home():
    """The episode's and the game's maps draw with viz (`top_down`, `draw_map`, `map_legend`): no
    colour is written down twice."""
    import inspect

    for mod in (EP, G):
        src = inspect.getsource(mod)
        # no rock grey, no floor ramp
        assert "45," not in src and "180 *" not in src, mod.__name__
        # no colours by name, no own legend
        assert "tab:" not in src and "_map_legend" not in src, mod.__name__
    game = G.Game(3)
    game.step()
    ax = G.plot_map(game, legend=True).axes[0]
    pal = viz.palette()
    enemy, player = (l for l in ax.lines if l.get_marker() == "o")
    # the frames' enemy red
    assert tuple(np.round(np.array(enemy.get_color()) * 255)) == tuple(pal.enemy)
    assert tuple(np.round(np.array(player.get_color()) * 255)) == tuple(pal.player)


def test_no_palette_is_copied_at_import():
    """Pictures read the palette from the spec when they draw: no module-level colour table goes
    stale after an edit."""
    assert not [k for k, v in vars(viz).items() if isinstance(v, np.ndarray)]


def test_drawing_leaves_matplotlib_alone(monkeypatch):
    """heatmap, figure_of, grid_figure and the charts return Figures; none switches the backend or
    opens a pyplot figure."""
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    monkeypatch.setattr(matplotlib, "use", lambda *a, **k: pytest.fail("matplotlib.use called"))
    before = plt.get_fignums()
    names = (["a", "b"], ["m0", "m1", "m2"], ["l0", "l1"])
    figs = [
        viz.heatmap(np.arange(12.0), names, held_out=[(1, 2, 0)], title="t"),
        viz.figure_of([np.zeros((4, 4, 3), np.uint8)] * 2, ["x", "y"]),
        viz.grid_figure(
            viz.mosaic([[np.zeros((4, 4, 3), np.uint8)] * 3] * 2), ["r0", "r1"], ["c0", "c1", "c2"]
        ),
        viz.figure_of([np.zeros((4, 4))] * 5, ncols=2),
        viz.lines({"loss": [3.0, 2.0]}, logy=True),
        viz.bars(
            {"a": [1, 2], "b": [2, 3]}, ["x", "y"], log=True, horizontal=True, line=(2, "cap")
        ),
        viz.scatter({"p": [(1, 2, "one")]}, logx=True),
    ]
    assert all(isinstance(f, Figure) for f in figs) and plt.get_fignums() == before


def test_sample_grid_takes_tensors():
    "Training and evaluation hand torch batches and predictions: the grid reads them as arrays."
    torch = pytest.importorskip("torch")
    rgb = torch.randint(0, 256, (6, 8, 8, 3), dtype=torch.uint8)
    batch = {"surface": torch.zeros((6, 8, 8), dtype=torch.uint8), "rgb": rgb}
    g = viz.sample_grid(batch, {1: rgb.numpy(), 4: rgb.numpy()}, n=3)
    assert g.shape == (4 * 8, 3 * 8, 3) and np.array_equal(g[8:16, 8:16], rgb[2].numpy())
    assert len(viz.episode_frames(batch, rgb.numpy())) == 6
