"""What a user hands the workbook is untrusted input (issue 55). Hypothesis generates theme files
(malformed YAML, aliases, deep nesting, NaN and inf, long and odd names, wrong types, huge values)
and config overrides, through the loader, `qmind render --theme` and one running `qmind serve
--theme` on loopback: every case is a one-line refusal or a valid render, within seconds. Also the
issue's reproducers as the console script runs them, a checkpoint write killed with SIGKILL, and
uvicorn's invalid-UTF-8 path in the server's log."""

import contextlib
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from qmind_render.cli import main
from qmind_render.contracts import UserError, load_theme_schema, one_line, validate_theme
from qmind_render.core.config import load_config
from qmind_render.serve.protocol import encode_array
from qmind_render.world.game import Game
from qmind_render.world.grid import load_grid
from qmind_render.world.themes import ThemeFileError, load_theme

from tests.test_serve import CLI, qmind_serve

GOOD = {**load_grid().theme("castle"), "name": "my_theme"}  # the issue's good.yaml
FUZZ = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
PATHS = [
    ("name",),
    ("description",),
    ("palette", "ceiling"),
    ("palette", "materials", 2, "accent", 1),
    ("pattern", "scale"),
    ("pattern", "mortar"),
    ("pattern", "grain"),
    ("pattern", "noise"),
]
ODD = ["evil\n", "a" * 41, "../x", "x/y", "My_Theme", "castle", "é", "\x00", "a b", "", "_"]
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**30), 10**30),
    st.sampled_from(ODD),
    st.text(max_size=50),
    st.text(min_size=1000, max_size=5000),
    st.booleans(),
    st.none(),
    st.lists(st.integers(0, 300), max_size=5),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


def put(record: dict, path: tuple, value) -> dict:
    "A deep copy of `record` with `path` set to `value` (None for the path's last key: deleted)."
    out = json.loads(json.dumps(record))
    node = out
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return out


@st.composite
def theme_files(draw) -> tuple[str, bytes]:
    "(file name, bytes): a good theme changed in one field, or text mangled, or a hostile file."
    kind = draw(st.sampled_from(["field", "field", "text", "hostile"]))
    suffix = draw(st.sampled_from([".yaml", ".json"]))
    if kind == "field":
        rec = put(GOOD, draw(st.sampled_from(PATHS)), draw(values))
        if suffix == ".json":
            return "t.json", json.dumps(rec, allow_nan=True).encode()
        return "t.yaml", yaml.safe_dump(rec, allow_unicode=True).encode()
    if kind == "text":
        text = yaml.safe_dump(GOOD, sort_keys=False).encode()
        at = draw(st.integers(0, len(text)))
        junk = draw(st.binary(max_size=20))
        return "t.yaml", text[:at] + junk + text[at + draw(st.integers(0, 20)) :]
    n = draw(st.integers(1, 5000))
    return draw(
        st.sampled_from(
            [
                ("t.yaml", b"name: [x\n"),
                ("t.json", b"[" * n + b"]" * n),
                ("t.yaml", b"[" * n + b"]" * n),
                ("t.yaml", b"a: &a [x, x, x]\nb: &b [*a, *a, *a]\nname: [*b, *b, *b]\n"),
                ("t.yaml", b"!!python/object/apply:os.system ['echo pwned']\n"),
                ("t.yaml", b"name: x\n---\nname: y\n"),
                ("t.yaml", b"name: my_theme\n\tpalette: {}\n"),
                ("t.yaml", yaml.safe_dump(GOOD).encode().replace(b"my_theme", b"my\xffth")),
                ("t.yaml", b"name: " + b"9" * n * 2 + b"\n"),
                ("t.json", b'{"name": ' + b"1" * 5000 + b"}"),
                ("t.yaml", b"x" * (70 << 10)),
            ]
        )
    )


def one_line_refusal(msg: str, path) -> None:
    assert "\n" not in msg.strip() and len(msg) < 600 and "Traceback" not in msg, msg[:800]
    assert str(path) in msg, msg


def is_valid(rec: dict) -> bool:
    "A record the loader may accept: it passes the schema, its numbers finite, its name whole."
    validate_theme(rec, load_theme_schema())
    nums = [*rec["pattern"].values(), rec["palette"]["ceiling"][0]]
    return all(math.isfinite(v) for v in nums) and re.fullmatch(
        r"[a-z][a-z0-9_]{0,39}", rec["name"]
    )


def test_fuzz_the_theme_loader(tmp_path):
    "Every file: a record the schema accepts, or one ThemeFileError line; fast, little memory."

    @settings(max_examples=80, **FUZZ)
    @given(f=theme_files())
    def check(f):
        path = tmp_path / f[0]
        path.write_bytes(f[1])
        tracemalloc.start()
        t0 = time.monotonic()
        try:
            rec = load_theme(path)
        except ThemeFileError as e:
            one_line_refusal(str(e), path)
        else:
            assert is_valid(rec), rec
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        # no parse runs for minutes or takes gigabytes (the alias bomb took 3 min and 6 GB)
        assert time.monotonic() - t0 < 10 and peak < 20e6, (time.monotonic() - t0, peak)

    check()


def test_fuzz_overrides():
    "A `key=value` override: a config, or one ConfigError line quoting it short."
    keys = st.sampled_from(
        ["train.lr", "train.steps", "name", "seed", "model.size", "eval.ddim_steps"]
    )
    raw = st.one_of(
        values.map(str),
        st.text(max_size=40),
        st.integers(1, 3000).map(lambda n: "[" * n),
        st.integers(1, 3000).map(lambda n: "${" * n),
        st.sampled_from(
            [".nan", "inf", "-.inf", "1e400", "*a", "&a [1]", "!!python/name:os.system"]
        ),
    )

    @settings(max_examples=50, **FUZZ)
    @given(key=keys, value=raw)
    def check(key, value):
        try:
            cfg = load_config(None, [f"{key}={value}"])
        except UserError as e:
            # as `qmind` prints it: one line, however long the value
            assert len(one_line(e)) < 700 and "Traceback" not in str(e), str(e)[:800]
        else:
            assert math.isfinite(cfg.train.lr) and cfg.train.lr > 0

    check()


def run_main(argv) -> tuple[int, str]:
    "`qmind ARGV` in this process: its exit status and its stderr."
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    return rc, err.getvalue()


def test_fuzz_qmind_render_theme(tmp_path):
    "`qmind render --theme FILE`: frames written, or one line, exit 2 and nothing in --out."

    @settings(max_examples=12, **FUZZ)
    @given(f=theme_files(), steps=st.sampled_from([None, None, "1", "0", "17", "-3"]))
    @example(
        f=("good.yaml", yaml.safe_dump(GOOD).encode()), steps=None
    )  # one valid render at least
    def check(f, steps):
        path, out = tmp_path / f[0], tmp_path / "out"
        path.write_bytes(f[1])
        argv = ["render", "--theme", str(path), "--out", str(out), "--frames", "1", "--scale", "1"]
        rc, err = run_main(argv + (["--steps", steps] if steps else ["--steps", "1"]))
        if rc == 0:
            assert (out / load_theme(path)["name"] / "frame_00000.png").is_file()
            rendered.append(path.name)
        else:
            assert rc == 2 and err.startswith("qmind render: error: "), err
            assert err.count("\n") == 1 and len(err) < 700, err
            assert not out.exists() or not any(out.rglob("*")), sorted(out.rglob("*"))
        for p in sorted(out.rglob("*"), reverse=True) if out.exists() else []:
            p.unlink() if p.is_file() else p.rmdir()

    rendered = []
    check()
    assert "good.yaml" in rendered


REPRODUCERS = {  # the issue's files, as it names them; good.yaml's theme with one thing changed
    "b.yaml": b"name: [x\n",
    "d.json": b"[" * 200000 + b"]" * 200000 + b"\n",
    "bomb.yaml": b"".join(
        b"a%d: &a%d [%s]\n" % (i, i, b", ".join([b"*a%d" % (i - 1)] * 9) if i else b"lol")
        for i in range(10)
    )
    + b"description: *a9\n",
    "nan.yaml": yaml.safe_dump(put(GOOD, ("pattern", "scale"), float("nan"))).encode(),
    "nan.json": json.dumps(put(GOOD, ("pattern", "grain"), float("nan"))).encode(),
    "evil.yaml": yaml.safe_dump({**GOOD, "name": "evil\n"}).encode(),
    "long.yaml": yaml.safe_dump({**GOOD, "name": "a" * 300}).encode(),
    "nul.yaml": b"name: my\x00theme\n",
    "latin1.yaml": "description: caf\xe9\n".encode("latin-1"),
}


def test_the_issues_reproducers_are_one_line_and_exit_2(tmp_path):
    """Each of the issue's files, a FIFO and /dev/zero through `qmind render --theme` and `qmind
    serve --theme` (the same check runs first in both), and `--steps 0` in both: one line, exit 2,
    nothing written. A few through the console script itself (a hang is its 30 s timeout), the
    rest through `main` in this process."""
    for name, data in REPRODUCERS.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "my.yaml").write_text(yaml.safe_dump(GOOD))
    os.mkfifo(tmp_path / "fifo.yaml")
    cases = [(c, ["--theme", str(tmp_path / f)]) for c in ("render", "serve") for f in REPRODUCERS]
    cases += [(c, ["--theme", str(tmp_path / "fifo.yaml")]) for c in ("render", "serve")]
    cases += [(c, ["--theme", "/dev/zero"]) for c in ("render", "serve")]
    cases += [(c, ["--theme", str(tmp_path / "my.yaml"), "--steps=0"]) for c in ("render", "serve")]
    console = {"d.json", "bomb.yaml", "fifo.yaml", "/dev/zero", "--steps=0"}
    for command, args in cases:
        argv = [command, *args, *(["--out", str(tmp_path / "o")] if command == "render" else [])]
        if console & {Path(a).name for a in args} | console & set(args):
            r = subprocess.run(CLI + argv, capture_output=True, text=True, timeout=30)
            rc, err = r.returncode, r.stderr
        else:
            rc, err = run_main(argv)
        said = (
            "--steps: steps must be an integer in 1..16, got 0"
            if "--steps=0" in args
            else "theme file "
        )
        assert rc == 2 and err.count("\n") == 1, (argv, err[-2000:])
        assert err.startswith(f"qmind {command}: error: {said}"), err
    assert not (tmp_path / "o").exists()


def test_render_steps_and_an_unknown_theme_are_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "o"
    for argv in (
        ["--theme", "nosuch"],
        ["--theme", "castle", "--lighting", "dusk"],
        ["--theme", str(tmp_path / "my.yaml"), "--steps", "0"],
        ["--theme", str(tmp_path / "my.yaml"), "--steps", "1000"],
    ):
        (tmp_path / "my.yaml").write_text(yaml.safe_dump(GOOD))
        rc, err = run_main(["render", "--out", str(out), "--frames", "2", *argv])
        assert rc == 2 and err.count("\n") == 1, err
        assert not out.exists(), (argv, sorted(out.rglob("*")))
    assert "--steps: steps must be an integer in 1..16, got 1000" in err


def test_a_checkpoint_write_killed_mid_way_is_cleared_when_the_run_resumes(tmp_path):
    "SIGKILL while step 4 is half written: its .tmp stays until resume removes it (and no other)."
    from qmind_render.core.checkpoint import pick_resume, save_checkpoint

    run = tmp_path / "run"
    state = lambda step: {"model": {}, "step": step, "config": {}, "versions": {}}
    save_checkpoint(state(2), run, keep_last=0)
    writer = (
        "import sys, time, torch\n"
        "from qmind_render.core.checkpoint import save_checkpoint\n"
        "def half(obj, f):\n"
        "    open(f, 'wb').write(b'half a checkpoint'); print('writing', flush=True)\n"
        "    time.sleep(120)\n"
        "torch.save = half\n"
        f"save_checkpoint({{'model': {{}}, 'step': 4}}, {str(run)!r}, keep_last=0)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing"
    p.send_signal(signal.SIGKILL)
    p.wait()
    ck = run / "checkpoints"
    [killed] = list(ck.glob(".0000004.pt.*.tmp"))
    # a live writer's file (the parent process's), and a file that is not a checkpoint's: left alone
    live, other = ck / f".0000006.pt.{os.getppid()}.0a1b2c3d.tmp", ck / ".notes.txt.1.0a1b2c3d.tmp"
    for f in (live, other):
        f.write_bytes(b"x")
    path, got = pick_resume(run, "latest")
    assert got["step"] == 2 and not killed.exists() and live.exists() and other.exists()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    "`qmind serve --theme my_theme.yaml` on a tiny untrained planes model (eager, 1 DDIM step)."
    from qmind_render.core.checkpoint import save_checkpoint, versions
    from qmind_render.core.config import config_to_dict
    from qmind_render.core.model import build_model

    tmp = tmp_path_factory.mktemp("untrusted")
    cfg = load_config(None, ["model.size=tiny", "model.theme_enc=planes", "name=tiny"])
    sd = build_model(cfg.model, grid=load_grid()).state_dict()
    state = {"model": sd, "ema": {f"module.{k}": v for k, v in sd.items()}, "step": 1}
    ck = save_checkpoint(
        {**state, "config": config_to_dict(cfg), "versions": versions()}, tmp / "tiny", 0
    )
    theme = tmp / "my_theme.yaml"
    theme.write_text(yaml.safe_dump(GOOD))
    with qmind_serve(
        "--checkpoint", str(ck), "--theme", str(theme), "--backend", "eager", "--steps", "1"
    ) as (url, log):
        yield url, log


# what a request may name a theme, lighting or step count with (short: a long one is 1009, tested
# in test_serve)
fields = st.one_of(
    st.sampled_from(["my_theme", "castle", 5, "daylight", 1, 16, 17, *ODD]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**30), 10**30),
    st.text(max_size=30),
    st.booleans(),
    st.none(),
    st.lists(st.integers(0, 300), max_size=3),
)


def test_fuzz_a_running_server_with_a_designed_theme(served):
    "/render and /play with odd themes, lightings and steps: a frame or a 4xx / 1007, never down."
    url, log = served
    ch = {k: encode_array(v) for k, v in Game(seed=3).step("forward").items()}
    client = httpx.Client(timeout=60)
    info = client.get(f"{url}/info").json()
    assert info["themes"][-1] == "my_theme" and info["theme_trained"][-1] is False
    answered = []

    @settings(max_examples=30, **FUZZ)
    @given(theme=fields, lighting=fields, steps=fields)
    @example(theme="my_theme", lighting="daylight", steps=1)
    def render(theme, lighting, steps):
        body = {"channels": ch, "theme": theme, "lighting": lighting, "steps": steps}
        r = client.post(
            f"{url}/render",
            content=json.dumps(body, allow_nan=True),
            headers={"content-type": "application/json"},
        )
        assert r.status_code in (200, 400, 422), (r.status_code, r.text[:300])
        answered.append(r.status_code)
        if r.status_code == 200:
            # a NaN anywhere made the frame black; the untrained model's is mid-grey
            assert np.asarray(Image.open(io.BytesIO(r.content))).max() > 0
        else:
            assert r.json()["where"] in ("theme", "lighting", "steps"), r.text[:300]

    @settings(max_examples=15, **FUZZ)
    @given(change=st.dictionaries(st.sampled_from(["theme", "lighting", "steps"]), fields))
    @example(change={"theme": "my_theme", "steps": 2})
    def play(change):
        with connect(url.replace("http", "ws") + "/play", open_timeout=30) as ws:
            json.loads(ws.recv(timeout=30))
            ws.send(json.dumps({"action": "forward", **change}, allow_nan=True))
            try:
                assert json.loads(ws.recv(timeout=60))["type"] == "frame"
                answered.append("frame")
            except ConnectionClosed as e:
                assert e.rcvd is not None and e.rcvd.code in (1007, 1009) and e.rcvd.reason, e

    render()
    play()
    assert {200, 422, "frame"} <= set(answered), answered  # frames made, and refusals
    # a text frame that is not UTF-8: closed with 1007 by uvicorn, and one line in the log
    with connect(url.replace("http", "ws") + "/play", open_timeout=30) as ws:
        ws.recv(timeout=30)
        ws.send(b"\xff\xfe{", text=True)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd.code == 1007
    time.sleep(0.3)
    said = [ln for ln in log["read"]().splitlines() if "UTF-8" in ln or "utf-8" in ln]
    assert len(said) == 1 and "Traceback" not in log["read"](), log["read"]()[-3000:]
    assert client.get(f"{url}/healthz").status_code == 200
