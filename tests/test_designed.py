"""A theme you design (issue 45), played and rendered for real: `qmind serve --theme FILE` in a
subprocess on loopback with the shipped model, its /info, a /play session and the page in headless
Chromium (the designed theme chosen from the menu, frames played, the page saying it was never
trained on, with the model's measured figure on new themes); `qmind render --theme FILE` writing
skinner | model PNGs (and `qmind render` without a theme file unchanged); a bad theme file and an
ID-encoded checkpoint each refused in one line."""

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image
from websockets.sync.client import connect

from qmind_render.cli import main
from qmind_render.core.new_themes import measured_new_themes, new_themes_line
from qmind_render.serve.protocol import RenderItem
from qmind_render.serve.renderer import Renderer, load_served, with_designed
from qmind_render.world.cells import episode_materials
from qmind_render.world.episode import render_episode
from qmind_render.world.game import Game
from qmind_render.world.skinner import skin
from qmind_render.world.themes import random_theme, save_theme

from tests.conftest import free_port, launch_chromium, needs_chromium
from tests.test_serve import CLI, qmind_serve

ROOT = Path(__file__).resolve().parents[1]
# set to write the page's screenshot to the docs' picture too
SAVE_SCREENSHOT = os.environ.get("QMIND_SAVE_SCREENSHOT") == "1"
SUNSET = random_theme(3, seed=2024, name="sunset")


@pytest.fixture(scope="module")
def theme_file(tmp_path_factory) -> Path:
    "A designed theme's file, as a user writes one (YAML)."
    return save_theme(SUNSET, tmp_path_factory.mktemp("themes") / "sunset.yaml")


@pytest.fixture(scope="module")
def designed():
    "The shipped model conditioned on the designed theme, in this process: what the server plays."
    return with_designed(load_served(), [SUNSET])


@pytest.fixture(scope="module")
def server(theme_file):
    "`qmind serve --theme FILE` on the shipped model (eager fp32, so frames compare exactly)."
    with qmind_serve("--theme", str(theme_file), "--backend", "eager") as (url, log):
        yield url, log


def the_line() -> str:
    "The shipped model's measured new-theme figure, in the line the page shows."
    d = measured_new_themes("shipped:small")
    assert d is not None, "the shipped model has no measured new-theme figure: run `qmind themes`"
    return new_themes_line(d, "shipped:small")


def qmind(*args, cwd=ROOT):
    return subprocess.run(CLI + list(args), cwd=cwd, capture_output=True, text=True, timeout=300)


def test_info_marks_the_designed_theme_and_says_what_to_expect(server):
    url, log = server
    info = httpx.get(f"{url}/info", timeout=10).json()
    assert info["themes"] == ["castle", "lab", "inferno", "temple", "neon", "sunset"]
    assert info["theme_trained"] == [True] * 5 + [False]
    assert info["new_themes"] == the_line() and info["new_themes"].startswith("on 8 themes")
    assert "designed theme(s) sunset (id 5), never trained on; on 8 themes" in log["read"]()


def test_a_designed_theme_plays_as_the_skinner_paints_it(server, designed):
    """A /play session in the designed theme: the ground truth is the skinner's painting of the
    theme file, the model's frame is the shipped model conditioned on it (not a grid theme's)."""
    url, _ = server
    with connect(url.replace("http", "ws") + "/play?seed=7&theme=sunset", open_timeout=30) as ws:
        hello = json.loads(ws.recv(timeout=60))
        ws.send(json.dumps({"action": "forward"}))
        msg = json.loads(ws.recv(timeout=60))
    assert hello["theme_trained"][-1] is False
    img = {
        k: np.frombuffer(base64.b64decode(v["rgb"]), np.uint8).reshape(64, 64, 3)
        for k, v in msg["images"].items()
        if k != "channels"
    }
    ch = Game(seed=7, materials=episode_materials(7)).step("forward")
    assert np.array_equal(img["truth"], skin(ch, SUNSET, designed.grid.lightings[0]))
    r = Renderer(designed, "eager")
    mine, castle = r.render([RenderItem(ch, t, 0, steps=1) for t in (5, 0)]).astype(int)
    assert np.abs(img["model"] - mine).max() <= 2
    assert np.abs(img["model"] - castle).mean() > 5  # the theme file reached the model


@needs_chromium
def test_the_page_plays_a_designed_theme_and_says_it_was_never_trained_on(server, tmp_path):
    from playwright.sync_api import sync_playwright

    url, _ = server
    errors = []
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url + "/")
            page.wait_for_function("Number(document.body.dataset.frames || 0) >= 1", timeout=60_000)
            labels = page.eval_on_selector_all("#theme option", "os => os.map(o => o.textContent)")
            assert labels[-1] == "sunset (designed, never trained on)" and labels[0] == "castle"
            # a grid theme: nothing to say
            assert page.locator("#theme-note").is_hidden()
            page.select_option("#theme", "sunset")
            page.wait_for_function("Number(document.body.dataset.frames) >= 2", timeout=30_000)
            for _ in range(3):  # a few frames played in it
                page.keyboard.press("ArrowUp")
                page.wait_for_function("document.body.dataset.waiting === 'no'", timeout=30_000)
            page.wait_for_function("Number(document.getElementById('frame').textContent) >= 3")
            note = page.locator("#theme-note")
            assert note.is_visible()
            text = note.inner_text()
            assert "“sunset” is a designed theme: this model was never trained on it" in text
            assert f"Held-out-theme quality: {the_line()}." in text
            page.screenshot(path=str(tmp_path / "designed_theme.png"))
            # back to a grid theme: the note goes
            page.select_option("#theme", "neon")
            assert note.is_hidden()
        finally:
            browser.close()
    assert errors == [], errors
    assert (tmp_path / "designed_theme.png").stat().st_size > 10_000
    if SAVE_SCREENSHOT:
        shutil.copyfile(
            tmp_path / "designed_theme.png", ROOT / "nbs" / "images" / "designed_theme.png"
        )


def test_a_bad_theme_file_is_one_line_naming_the_field(theme_file, tmp_path, capsys):
    "Refused before the model loads: the file, the field, the rule; exit 2, no traceback."
    bad = tmp_path / "bad.yaml"
    bad.write_text(theme_file.read_text().replace("scale:", "scale: 99 #"))
    grid_name = tmp_path / "castle.yaml"
    grid_name.write_text(theme_file.read_text().replace("name: sunset", "name: castle"))
    for f, msg in [
        (bad, "field 'pattern.scale': 99 is greater than the maximum of 8"),
        (grid_name, "name 'castle' is a grid theme"),
    ]:
        assert main(["serve", "--theme", str(f), "--port", str(free_port())]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert err.startswith(f"qmind serve: error: theme file {f}: ") and msg in err, err
    # the console script itself: one line, no traceback
    r = qmind("render", "--out", str(tmp_path / "o"), "--theme", str(bad))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert (
        r.stderr.startswith(f"qmind render: error: theme file {bad}: ")
        and "pattern.scale" in r.stderr
    )


def tiny_checkpoint(run: Path, theme_enc: str = "id") -> Path:
    "A tiny untrained model with `model.theme_enc=theme_enc`, saved as a checkpoint of run `run`."
    from qmind_render.core.checkpoint import save_checkpoint, versions
    from qmind_render.core.config import config_to_dict, load_config
    from qmind_render.core.model import build_model
    from qmind_render.world.grid import load_grid

    cfg = load_config(None, ["model.size=tiny", f"model.theme_enc={theme_enc}", f"name={run.name}"])
    sd = build_model(cfg.model, grid=load_grid()).state_dict()
    state = {
        "model": sd,
        "ema": {f"module.{k}": v for k, v in sd.items()},
        "config": config_to_dict(cfg),
        "versions": versions(),
        "step": 1,
    }
    return save_checkpoint(state, run, keep_last=0)


def test_an_id_encoded_model_is_refused_by_name(theme_file, tmp_path, capsys):
    ck = tiny_checkpoint(tmp_path / "idrun")
    why = (
        "idrun/0000001.pt cannot play a designed theme: model.theme_enc=id cannot render a theme "
        "it never trained on"
    )
    for argv in (
        ["serve", "--port", str(free_port()), "--backend", "eager"],
        ["render", "--frames", "1", "--out", str(tmp_path / "o")],
    ):
        assert main([*argv, "--checkpoint", str(ck), "--theme", str(theme_file)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and why in err, err
    assert not (tmp_path / "o").exists()
    # without a designed theme it serves as before: the refusal is the theme's, not the model's
    served = load_served(ck)
    assert with_designed(served, []) is served


def test_render_theme_writes_skinner_and_model_side_by_side(theme_file, designed, tmp_path):
    out = tmp_path / "out"
    args = ["--seed", "3", "--frames", "4", "--every", "2", "--scale", "1", "--out", str(out)]
    r = qmind("render", *args, "--theme", str(theme_file))
    assert r.returncode == 0, r.stderr
    assert f"to {out / 'sunset'}" in r.stdout and "never trained on; on 8 themes" in r.stdout
    assert sorted(p.name for p in (out / "sunset").iterdir()) == [
        "frame_00000.png",
        "frame_00002.png",
    ]
    frames = list(render_episode(3, 4))
    g = designed.grid
    light, l = g.lighting("daylight"), g.lighting_id("daylight")
    model = Renderer(designed, "eager").render(
        [RenderItem(frames[i], 5, l, steps=1) for i in (0, 2)]
    )
    for k, i in enumerate((0, 2)):
        png = np.asarray(Image.open(out / "sunset" / f"frame_{i:05d}.png"))
        assert png.shape == (64, 130, 3)
        assert np.array_equal(png[:, :64], skin(frames[i], SUNSET, light))
        assert np.abs(png[:, 66:].astype(int) - model[k]).max() <= 2


def test_render_without_a_theme_file_is_the_worlds_command_unchanged(tmp_path):
    "`qmind render --theme NAME`, as before issue 45: the same files, byte for byte."
    from qmind_render.world.explorer import render_main

    args = ["--seed", "2", "--frames", "2", "--scale", "1", "--theme", "lab"]
    assert main(["render", *args, "--out", str(tmp_path / "cli")]) == 0
    assert render_main([*args, "--out", str(tmp_path / "world")]) == 0
    made = sorted(p.relative_to(tmp_path / "cli") for p in (tmp_path / "cli").rglob("*.png"))
    world = sorted(p.relative_to(tmp_path / "world") for p in (tmp_path / "world").rglob("*.png"))
    assert made == world and len(made) == 5  # 2 strips, 2 skinned strips, the map
    for p in made:
        if p.name != "map.png":
            assert (tmp_path / "cli" / p).read_bytes() == (tmp_path / "world" / p).read_bytes(), p


def test_qmind_themes_measures_a_run_and_the_figure_follows_its_file(tmp_path, capsys):
    """`qmind themes RUN` writes RUN/eval/new_themes.json, which `measured_new_themes` gives for
    that checkpoint and no other file; an ID-encoded run is refused in one line."""
    import json

    from qmind_render.core.new_themes import measured_new_themes

    ck = tiny_checkpoint(tmp_path / "run", theme_enc="planes")
    assert main(["themes", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    d = json.loads((tmp_path / "run" / "eval" / "new_themes.json").read_text())
    assert d["themes"] == 8 and d["frames"] == 8 * 5 * 4 * 2 and d["psnr_ci"][0] < d["psnr"]
    assert f"{d['psnr']:.1f} dB PSNR" in out and "written:" in out
    assert measured_new_themes(ck)["psnr"] == d["psnr"]
    # the validation themes (another seed, to choose between models on): a file of their own
    assert main(["themes", str(tmp_path / "run"), "--themes", "validation"]) == 0
    v = json.loads((tmp_path / "run" / "eval" / "new_themes_validation.json").read_text())
    assert (v["seed"], v["set"], d["seed"], d["set"]) == (2000, "validation", 1000, "test")
    assert v["per_frame"]["psnr"] != d["per_frame"]["psnr"]  # other themes, other frames
    assert measured_new_themes(ck, "validation")["psnr"] == v["psnr"]
    assert measured_new_themes(ck)["psnr"] == d["psnr"]  # the test figure left as it was
    assert v["command"].endswith("--themes validation")
    ck.write_bytes(ck.read_bytes() + b" ")  # another file: not this figure's
    assert measured_new_themes(ck) is None
    bad = tiny_checkpoint(tmp_path / "idrun")
    assert main(["themes", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "model.theme_enc=id cannot render a theme" in err and len(err.splitlines()) == 1
