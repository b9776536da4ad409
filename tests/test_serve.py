"""The inference server for real: `qmind serve` in a subprocess on loopback with a trained
checkpoint; HTTP and WebSocket clients; bad input of every kind the issue names; a bounded load
test; fuzzing of /render and /play (hypothesis); and the page in headless Chromium (Playwright)."""

import base64
import contextlib
import os
import io
import json
import subprocess
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from qmind_render.world.game import Game
from qmind_render.serve.protocol import encode_array, render_request
from qmind_render.core.eval_result import summary_psnr
from qmind_render.serve.renderer import load_served
from qmind_render.serve.serve_bench import load_test

from tests.conftest import chromium_page, free_port, launch_chromium, needs_chromium

CLI = [sys.executable, "-c", "import sys; from qmind_render.cli import main; sys.exit(main())"]
ROOT = Path(__file__).resolve().parents[1]
MAX_SESSIONS = 3
MAX_RENDERS = 2


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    "A real (short) training run of the tiny model: the checkpoint the server loads."
    from qmind_render.core.config import load_config
    from qmind_render.data.generate import generate
    from qmind_render.core.train import train

    tmp = tmp_path_factory.mktemp("serve")
    cfg = load_config(
        "quickstart",
        [
            f"data.store={tmp}/store",
            "data.dataset=ds-serve",
            "data.episodes=6",
            "data.frames_per_episode=8",
            "name=served",
            "train.steps=3",
            "train.batch=4",
            "train.warmup=1",
            "train.sample_every=0",
            "tracker=none",
            "train.log_every=1",
        ],
    )
    # the dataset cache is this module's, and only while training
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QMIND_CACHE", str(tmp / "cache"))
        generate(cfg.data, workers=1, progress=False)
        res = train(cfg, tmp / "runs")
    assert res["status"].startswith("finished"), res
    return tmp / "runs" / "served"


@contextlib.contextmanager
def qmind_serve(*args):
    """`qmind serve ARGS` as a user runs it, on a free loopback port, once /healthz answers; yields
    (url, log): log['read']() is its output so far, log['out'] all of it, set at exit."""
    port, out = free_port(), tempfile.TemporaryFile("w+")
    log = {"out": "", "read": lambda: (out.seek(0), out.read())[1]}
    proc = subprocess.Popen(
        CLI + ["serve", "--port", str(port), *args], stdout=out, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log["read"]()
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.2)
        yield url, log
    finally:
        proc.send_signal(2)  # Ctrl-C
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log["out"] = log["read"]()
        out.close()
        assert "Traceback" not in log["out"], log["out"][-3000:]


@pytest.fixture(scope="module")
def server(run_dir):
    "`qmind serve` on a trained run; stopped (SIGINT) at the end."
    with qmind_serve(
        "--checkpoint",
        str(run_dir),
        "--steps",
        "3",
        "--backend",
        "eager",
        "--max-sessions",
        str(MAX_SESSIONS),
        "--max-wait-ms",
        "5",
        "--max-renders",
        str(MAX_RENDERS),
    ) as (url, log):
        server_log.update(log)
        yield url


server_log = {}  # the module server's log: server_log["read"]() is its output so far


def healthy(url):
    h = httpx.get(f"{url}/healthz", timeout=10)
    return h.status_code == 200 and h.json()["status"] == "ok"


@pytest.fixture(scope="module")
def channels():
    g = Game(seed=3)
    for _ in range(4):
        g.step("forward")
    return g.step("turn_left")


def png(content) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(content)))


def test_render_returns_the_frame_deterministically(server, channels, run_dir):
    r1 = httpx.post(
        f"{server}/render",
        json=render_request(channels, "castle", "torchlight", seed=5),
        timeout=30,
    )
    r2 = httpx.post(
        f"{server}/render",
        json=render_request(channels, "castle", "torchlight", seed=5),
        timeout=30,
    )
    assert r1.status_code == 200 and r1.headers["content-type"] == "image/png"
    # same input, same bytes
    assert png(r1.content).shape == (64, 64, 3) and r1.content == r2.content
    r3 = httpx.post(
        f"{server}/render",
        json=render_request(channels, "neon", "toxic", seed=5, format="npy"),
        timeout=30,
    )
    assert np.load(io.BytesIO(r3.content)).shape == (64, 64, 3)
    # the theme matters
    assert not np.array_equal(np.load(io.BytesIO(r3.content)), png(r1.content))
    info = httpx.get(f"{server}/info").json()
    assert (
        info["model"] == "tiny"
        and info["step"] == 3
        and info["backend"] == "eager"
        and info["source"] == "served/0000003.pt"
    )
    with _ws(server) as ws:
        hello = ws.recv(timeout=30)
    # no path of the server's disk
    for text in (httpx.get(f"{server}/info").text, httpx.get(f"{server}/healthz").text, hello):
        assert str(run_dir) not in text and str(run_dir.parent) not in text, text[:500]


def _bad_requests(ch):
    body = render_request(ch, "castle", 0)
    chans = body["channels"]
    yield (
        "not json",
        dict(content=b"{oops", headers={"content-type": "application/json"}),
        400,
        "body",
    )
    yield (
        "text/plain",
        dict(content=json.dumps(body), headers={"content-type": "text/plain"}),
        415,
        "content-type",
    )
    yield "a list", dict(json=[1, 2]), 422, "body"
    yield "no channels", dict(json={"theme": 0, "lighting": 0}), 422, "channels"
    yield "unknown field", dict(json={**body, "model": "x"}), 422, "model"
    yield "unknown theme", dict(json={**body, "theme": "disco"}), 422, "theme"
    yield "theme id", dict(json={**body, "theme": 99}), 422, "theme"
    yield "lighting type", dict(json={**body, "lighting": [1]}), 422, "lighting"
    yield "steps", dict(json={**body, "steps": 1000}), 422, "steps"
    yield "format", dict(json={**body, "format": "gif"}), 422, "format"
    yield (
        "wrong shape",
        dict(json={**body, "channels": {**chans, "depth": encode_array(ch["depth"][:32])}}),
        422,
        "channels.depth",
    )
    yield (
        "wrong dtype",
        dict(json={**body, "channels": {**chans, "uv": encode_array(ch["uv"].astype(np.float32))}}),
        422,
        "channels.uv",
    )
    yield (
        "bad base64",
        dict(json={**body, "channels": {**chans, "light": {**chans["light"], "data": "@@"}}}),
        422,
        "channels.light",
    )
    yield (
        "missing channel",
        dict(json={**body, "channels": {k: v for k, v in chans.items() if k != "surface"}}),
        422,
        "channels.surface",
    )
    yield (
        "extra channel",
        dict(json={**body, "channels": {**chans, "normal": chans["light"]}}),
        422,
        "channels.normal",
    )
    bad_mat = ch["material"].copy()
    bad_mat[0, 0] = 77
    yield (
        "material range",
        dict(json={**body, "channels": {**chans, "material": encode_array(bad_mat)}}),
        422,
        "channels.material",
    )
    nan = ch["depth"].copy()
    nan[5, 5] = np.nan
    yield (
        "nan depth",
        dict(json={**body, "channels": {**chans, "depth": encode_array(nan)}}),
        422,
        "channels.depth",
    )
    yield (
        "oversized",
        dict(content=b" " * 400_000, headers={"content-type": "application/json"}),
        413,
        "body",
    )
    yield (
        "nested 1000 deep",
        dict(content=b"[" * 1000 + b"]" * 1000, headers={"content-type": "application/json"}),
        400,
        "body",
    )
    yield (
        "lone surrogate key",
        dict(
            content=json.dumps({**body, "\ud800": 1}), headers={"content-type": "application/json"}
        ),
        400,
        "body",
    )
    yield (
        "lone surrogate value",
        dict(
            content=json.dumps({**body, "theme": "\udfff"}),
            headers={"content-type": "application/json"},
        ),
        400,
        "body",
    )


def test_bad_requests_get_a_4xx_naming_the_field(server, channels):
    for name, kw, status, where in _bad_requests(channels):
        r = httpx.post(f"{server}/render", timeout=30, **kw)
        assert r.status_code == status, (name, r.status_code, r.text[:300])
        assert r.json()["where"] == where, (name, r.json())
    # a body with no content-length (chunked) is cut off at the limit too
    r = httpx.post(
        f"{server}/render",
        content=iter([b" " * 65536] * 8),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 413
    assert (
        httpx.get(f"{server}/render").status_code == 405
        and httpx.get(f"{server}/nope").status_code == 404
    )
    assert (
        healthy(server)
        and httpx.post(
            f"{server}/render", json=render_request(channels, 0, 0), timeout=30
        ).status_code
        == 200
    )
    counts = httpx.get(f"{server}/metrics").json()["counts"]
    assert counts["http POST /render 422"] >= 15 and counts["http POST /render 413"] >= 2


def test_render_admission_is_capped(server, channels):
    """MAX_RENDERS requests in progress (here: held open mid-body) fill the server; the next is a
    503 with Retry-After, at once."""
    release, results = threading.Event(), []

    def slow_body():
        yield b'{"theme": 0, '
        release.wait(30)
        # the rest of a valid body
        yield json.dumps(render_request(channels, 0, 0, steps=1))[1:].encode()

    def post():
        results.append(
            httpx.post(
                f"{server}/render",
                content=slow_body(),
                headers={"content-type": "application/json"},
                timeout=60,
            )
        )

    holders = [threading.Thread(target=post) for _ in range(MAX_RENDERS)]
    for t in holders:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while httpx.get(f"{server}/metrics").json()["renders"] < MAX_RENDERS:
            assert time.monotonic() < deadline, "the held requests never arrived"
            time.sleep(0.05)
        busy = httpx.post(
            f"{server}/render", json=render_request(channels, 0, 0, steps=1), timeout=30
        )
        assert (
            busy.status_code == 503
            and busy.headers["retry-after"] == "1"
            and f"max_renders={MAX_RENDERS}" in busy.json()["error"]
        )
        # players are not /render clients: still served
        with _ws(server) as ws:
            json.loads(ws.recv(timeout=30))
            _frame(ws, {"action": "forward"})
    finally:
        release.set()
        for t in holders:
            t.join(60)
    # the held ones finish as usual
    assert [r.status_code for r in results] == [200] * MAX_RENDERS
    assert (
        httpx.post(
            f"{server}/render", json=render_request(channels, 0, 0, steps=1), timeout=30
        ).status_code
        == 200
    )


def test_client_gone_mid_body_is_not_an_error(server):
    """A client that sends half a body and disconnects: counted, no traceback or ERROR line in the
    server's log."""
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /render HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            b'application/json\r\nContent-Length: 5000\r\n\r\n{"chan'
        )
        time.sleep(0.3)
    deadline = time.monotonic() + 10
    while (
        "render: client gone" not in httpx.get(f"{server}/metrics").json()["counts"]
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    out = server_log["read"]()
    assert "Traceback" not in out and "ERROR" not in out, out[-2000:]
    assert httpx.get(f"{server}/metrics").json()["counts"]["render: client gone"] >= 1


def _ws(server, query="steps=1"):
    return connect(
        f"{server.replace('http', 'ws')}/play?{query}", open_timeout=30, max_size=1 << 22
    )


def _frame(ws, msg):
    ws.send(json.dumps(msg))
    m = json.loads(ws.recv(timeout=60))
    assert m["type"] == "frame", m
    return m


def _img(m, k):
    return np.frombuffer(base64.b64decode(m["images"][k]["rgb"]), np.uint8).reshape(
        m["images"][k]["h"], m["images"][k]["w"], 3
    )


def test_play_session_steps_the_engine_and_renders(server):
    with _ws(server, "theme=lab&lighting=daylight&seed=7&steps=1") as ws:
        hello = json.loads(ws.recv(timeout=30))
        assert hello["type"] == "hello" and hello["seed"] == 7 and "castle" in hello["themes"]
        f1 = _frame(ws, {"action": "forward"})
        f2 = _frame(ws, {"action": "turn_left"})
        f3 = _frame(ws, {"action": "noop", "theme": "inferno", "lighting": "toxic"})
    assert (f1["frame"], f2["frame"], f3["frame"]) == (1, 2, 3) and f2["action"] == "turn_left"
    # noop doesn't move
    assert f1["player"] != f2["player"] and f2["player"] == f3["player"]
    assert set(f1["timings"]) == {"engine_ms", "skin_ms", "model_ms", "total_ms", "batch"}
    assert _img(f1, "model").shape == (64, 64, 3) and _img(f1, "channels").shape[0] == 64
    # the view turned
    assert not np.array_equal(_img(f1, "truth"), _img(f2, "truth"))
    # same place, same channels ...
    assert np.array_equal(_img(f2, "channels"), _img(f3, "channels"))
    # ... another theme and lighting
    assert not np.array_equal(_img(f2, "truth"), _img(f3, "truth"))
    assert not np.array_equal(_img(f2, "model"), _img(f3, "model"))


def _closed_with(ws) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as e:
        for _ in range(3):
            ws.recv(timeout=30)
    return e.value.rcvd.code, e.value.rcvd.reason


@pytest.mark.parametrize(
    "send, code, reason",
    [
        (b"\x00\x01", 1003, "binary"),
        ("forward", 1007, "not JSON"),
        ('{"action": "jump"}', 1007, "unknown action 'jump'"),
        ('{"theme": "disco"}', 1007, "unknown theme"),
        ('{"action": "forward", "extra": 1}', 1007, "unknown key"),
        ("x" * 5000, 1009, ""),
    ],
    ids=["binary", "not-json", "unknown-action", "unknown-theme", "unknown-key", "too-big"],
)
def test_bad_play_messages_close_with_a_reason(server, send, code, reason):
    with _ws(server) as ws:
        json.loads(ws.recv(timeout=30))
        ws.send(send)
        got_code, got_reason = _closed_with(ws)
    assert got_code == code and reason in got_reason, (got_code, got_reason)
    assert healthy(server)


@pytest.mark.parametrize(
    "query, reason",
    [
        ("theme=disco", "unknown theme 'disco'"),
        ("seed=%C2%B2", "seed: must be an integer"),
        ("steps=", "steps: must be an integer"),
    ],
)
def test_bad_session_parameters_are_refused(server, query, reason):
    with _ws(server, query) as ws:
        code, got = _closed_with(ws)
    assert code == 1007 and reason in got, (code, got)


def test_too_many_sessions_and_disconnects_mid_frame(server):
    wss = [_ws(server) for _ in range(MAX_SESSIONS)]  # closed by hand below, to vanish mid-frame
    try:
        for ws in wss:
            json.loads(ws.recv(timeout=30))
        with _ws(server) as extra:
            code, reason = _closed_with(extra)
        assert code == 1013 and f"max_sessions={MAX_SESSIONS}" in reason
        # ask for a frame, then vanish before it comes
        for ws in wss:
            ws.send(json.dumps({"action": "forward"}))
    finally:
        for ws in wss:
            ws.close()
    deadline = time.monotonic() + 30
    while (m := httpx.get(f"{server}/metrics").json())["sessions"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (
        m["sessions"] == 0
        and m["counts"]["play refused: busy"] >= 1
        and m["counts"]["play disconnected"] >= 1
    )
    with _ws(server) as ws:  # places were given back
        json.loads(ws.recv(timeout=30))
        assert _frame(ws, {"action": "back"})["frame"] == 1


IDLE_S = 1.5


@pytest.fixture(scope="module")
def idle_server():
    """An in-process server (an untrained tiny model) whose /play sessions idle out after IDLE_S,
    pinging its clients every 0.2 s and closing one that does not answer within 0.6 s (uvicorn's
    keepalive, sped up from 20 s)."""
    from qmind_render.serve import server
    from qmind_render.serve.renderer import random_served
    from qmind_render.serve.settings import ServeSettings

    real = server._uvicorn_config

    def fast_pings(*a, **kw):
        c = real(*a, **kw)
        c.ws_ping_interval, c.ws_ping_timeout = 0.2, 0.6
        return c

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(server, "_uvicorn_config", fast_pings)
        srv = server.ServerThread(
            random_served("tiny"),
            ServeSettings(backend="eager", steps=1, session_idle_s=IDLE_S, max_sessions=2),
        )
    with srv as url:
        yield url


def test_idle_sessions_that_answer_pings_are_closed_and_free_their_places(idle_server):
    """The issue's lock-out: every place taken by a session that answers pings (the server's, every
    0.2 s; and its own) but asks for no frame. Each is closed with 1001 after session_idle_s, not
    before, and the next player gets in."""
    with contextlib.ExitStack() as opened:
        wss = [opened.enter_context(_ws(idle_server)) for _ in range(2)]
        for ws in wss:
            json.loads(ws.recv(timeout=30))
        t0, pongs = time.monotonic(), 0
        # pings both ways: a live client, not a player
        while time.monotonic() - t0 < IDLE_S - 0.5:
            pongs += sum(ws.ping().wait(5) for ws in wss)
            time.sleep(0.1)
        # a client that left the server's pings unanswered: 1011
        closed = [_closed_with(ws) for ws in wss]
        waited = time.monotonic() - t0
    assert closed == [(1001, f"idle {IDLE_S:g} s")] * 2 and waited >= IDLE_S - 0.1 and pongs >= 4, (
        closed,
        waited,
        pongs,
    )
    with _ws(idle_server) as ws:  # the places were given back
        json.loads(ws.recv(timeout=30))
        assert _frame(ws, {"action": "forward"})["frame"] == 1
    assert httpx.get(f"{idle_server}/metrics").json()["counts"]["play closed: idle"] >= 2


def test_a_player_is_served_while_render_requests_fill_the_cap(server, channels):
    """Fair scheduling end to end: while more /render clients than max_renders keep the cap full, a
    player's frames run in batches of their own (a batch holds one kind) and wait no longer than a
    /render request does."""
    stop, render_ms, busy = threading.Event(), [], []
    body = render_request(channels, 0, 0, steps=2)

    def flood():
        with httpx.Client(timeout=60) as c:
            while not stop.is_set():
                r = c.post(f"{server}/render", json=body)
                if r.status_code == 200:
                    render_ms.append(float(r.headers["x-server-ms"]))
                # refused at the cap: come back soon, as Retry-After says
                else:
                    busy.append(r.status_code)
                    time.sleep(0.05)

    floods = [threading.Thread(target=flood) for _ in range(MAX_RENDERS + 1)]
    for t in floods:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while not busy:  # the cap is full
            assert time.monotonic() < deadline, "the /render clients never filled the cap"
            time.sleep(0.05)
        with _ws(server, "steps=1") as ws:
            json.loads(ws.recv(timeout=30))
            frames = [_frame(ws, {"action": "forward"})["timings"] for _ in range(5)]
    finally:
        stop.set()
        for t in floods:
            t.join(60)
    player = sorted(f["model_ms"] for f in frames)
    # the cap was full: more came than it admits
    assert busy and set(busy) == {503}, busy[:5]
    # never batched with /render work
    assert [f["batch"] for f in frames] == [1] * 5, frames
    assert player[len(player) // 2] <= 1.5 * sorted(render_ms)[len(render_ms) // 2], (
        player,
        sorted(render_ms),
    )


def test_load_test_batches_concurrent_clients(server):
    one = load_test(server, clients=1, seconds=2.0, steps=1)
    three = load_test(server, clients=MAX_SESSIONS, seconds=3.0, steps=1)
    assert one["errors"] == [] and three["errors"] == [], (one, three)
    assert one["frames"] >= 1 and three["frames"] >= MAX_SESSIONS
    # concurrent requests ran as batches
    assert one["mean_batch"] == 1.0 and three["mean_batch"] > 1.5
    assert 0 < three["p50_ms"] <= three["p99_ms"]
    assert healthy(server)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
    max_leaves=12,
)


@st.composite
def render_bodies(draw, ch):
    "Mostly-valid bodies with one part replaced by something arbitrary."
    body = render_request(ch, "castle", 0)
    where = draw(
        st.sampled_from(
            [
                "theme",
                "lighting",
                "seed",
                "steps",
                "format",
                "channels",
                "depth",
                "uv",
                "shape",
                "dtype",
                "data",
                "extra",
            ]
        )
    )
    v = draw(json_values)
    if where in ("theme", "lighting", "seed", "steps", "format", "channels"):
        body[where] = v
    elif where in ("depth", "uv"):
        body["channels"][where] = v
    elif where in ("shape", "dtype", "data"):
        body["channels"]["light"] = {**body["channels"]["light"], where: v}
    else:
        body[draw(st.text(min_size=1, max_size=8))] = v
    return body


def test_fuzz_render(server, channels):
    client = httpx.Client(timeout=30)

    @settings(
        max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
    )
    @given(body=render_bodies(channels))
    def check(body):
        r = client.post(
            f"{server}/render",
            content=json.dumps(body, allow_nan=True),
            headers={"content-type": "application/json"},
        )
        assert r.status_code in (200, 400, 422), (r.status_code, r.text[:200])
        if r.status_code != 200:
            assert r.json()["error"] and r.json()["where"]

    @settings(
        max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
    )
    @given(raw=st.binary(max_size=300))
    def check_raw(raw):
        r = client.post(
            f"{server}/render", content=raw, headers={"content-type": "application/json"}
        )
        assert r.status_code in (400, 422), (r.status_code, r.text[:200])

    check()
    check_raw()
    assert healthy(server)


def test_fuzz_play(server):
    messages = st.one_of(
        json_values.map(json.dumps),
        st.text(max_size=60),
        st.fixed_dictionaries(
            {},
            optional={
                "action": json_values | st.sampled_from(["forward", "noop", "jump"]),
                "theme": json_values,
                "steps": json_values,
            },
        ).map(json.dumps),
    )

    @settings(
        max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
    )
    @given(msg=messages)
    def check(msg):
        with _ws(server) as ws:
            json.loads(ws.recv(timeout=30))
            ws.send(msg)
            try:
                m = json.loads(ws.recv(timeout=60))
            except ConnectionClosed as e:
                assert e.rcvd is not None and e.rcvd.code in (1007, 1009) and e.rcvd.reason, e
                return
            assert m["type"] == "frame"

    check()
    assert healthy(server) and httpx.get(f"{server}/metrics").json()["sessions"] == 0


def test_binds_loopback_only(server):
    import socket

    port = int(server.rsplit(":", 1)[1])
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = "127.0.0.1"
    if ip.startswith("127."):
        pytest.skip("this machine has no non-loopback address to try")
    with socket.socket() as s:
        s.settimeout(2)
        assert s.connect_ex((ip, port)) != 0, f"the server answered on {ip}"


def test_serve_cli_errors(tmp_path, run_dir, capsys):
    """A run dir that is not there, as a user meets it (`qmind serve` in a process of its own, exit
    status 2); a step count out of range and a device this machine lacks, refused before the model
    loads, in this process."""
    from qmind_render.cli import main

    r = subprocess.run(
        CLI + ["serve", "--checkpoint", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "no such run dir or checkpoint" in r.stderr
    assert main(["serve", "--checkpoint", str(run_dir), "--steps", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "steps must be an integer in 1..16" in err, err
    # not "the checkpoint is corrupt": the device is named
    if not torch.cuda.is_available():
        assert main(["serve", "--checkpoint", str(run_dir), "--device", "cuda"]) == 2
        err = capsys.readouterr().err
        assert (
            err.count("\n") == 1
            and "--device=cuda, but this machine has no CUDA device" in err
            and "Traceback" not in err
        ), err


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--max-batch", "0"], "max_batch must be an integer in 1..256, got 0"),
        (["--max-wait-ms", "-1"], "max_wait_ms must be in 0..1000, got -1.0"),
        (["--port", "99999"], "--port 99999 is not a TCP port"),
        (["--session-idle-s", "0"], "session_idle_s must be in 0.1..86400"),
        (["--allow-origin", "evil.example"], "'evil.example' is not an origin"),
        (["--allow-host", "box.lan:8000"], "'box.lan:8000' is not a host name or address"),
        (["--device", "mps"], "--device=mps, but this machine has no MPS device"),
        (["--port", "TAKEN"], "is in use (another qmind serve?)"),
    ],
)
def test_serve_options_are_refused_before_anything_slow(capsys, args, msg):
    """Checked before the model loads: the checkpoint does not exist, and it is the option that is
    named, in one line, exit 2."""
    from qmind_render.cli import main

    if args == ["--device", "mps"] and torch.mps.is_available():
        pytest.skip("this machine has MPS")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        args = [str(taken.getsockname()[1]) if a == "TAKEN" else a for a in args]
        assert main(["serve", "--checkpoint", "/nonexistent/run", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err and "no such run dir" not in err, err


def test_a_corrupt_latest_checkpoint_says_what_serve_takes(run_dir, tmp_path, capsys):
    "Not the training advice (train.resume=NAME): the file to give --checkpoint instead."
    import shutil

    from qmind_render.cli import main

    ck = tmp_path / "r4" / "checkpoints"
    ck.mkdir(parents=True)
    shutil.copy(run_dir / "checkpoints" / "0000003.pt", ck / "0000002.pt")
    (ck / "0000004.pt").write_bytes(b"truncated")
    assert (
        main(
            [
                "serve",
                "--checkpoint",
                str(ck.parent),
                "--port",
                str(free_port()),
                "--backend",
                "eager",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "0000004.pt is not a readable checkpoint" in err, err
    assert (
        f"other checkpoints: 0000002.pt (serve it with --checkpoint {ck / '0000002.pt'})" in err
        and "train.resume" not in err
    ), err


def test_onnx_renders_like_eager(run_dir, channels):
    from qmind_render.serve.protocol import render_item
    from qmind_render.serve.renderer import Renderer

    sv = load_served(run_dir)
    items = [render_item(channels, t, t % 4, sv.grid, sv.spec, seed=t, steps=2) for t in range(3)]
    a = Renderer(sv, "eager").render(items).astype(int)
    b = Renderer(sv, "onnx").render(items).astype(int)
    assert np.abs(a - b).max() <= 2 and np.abs(a - b).mean() < 0.05


@needs_chromium
def test_page_in_chromium(server, tmp_path):
    from playwright.sync_api import sync_playwright

    outside, errors = [], []
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.on(
                "request",
                lambda r: (
                    None
                    if r.url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:"))
                    else outside.append(r.url)
                ),
            )
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(server + "/")
            frames = lambda: int(page.evaluate("Number(document.body.dataset.frames || 0)"))
            served = lambda: httpx.get(f"{server}/metrics").json()["counts"].get("play frames", 0)
            page.wait_for_function("Number(document.body.dataset.frames || 0) >= 1", timeout=60_000)
            # play.js ran, and play.css styles the page:
            assert page.locator("#status").inner_text() == "playing"
            assert (
                page.evaluate("getComputedStyle(document.body).backgroundColor")
                == "rgb(21, 22, 26)"
            )
            # the menu offers every step count the server accepts, and the server's --steps 3 is
            # chosen
            assert page.eval_on_selector_all("#steps option", "os => os.map(o => o.value)") == [
                str(k) for k in range(1, 17)
            ]
            assert page.input_value("#steps") == "3"
            # nothing pressed: the page asks for nothing more, and the server renders nothing
            before = served()
            page.wait_for_timeout(1000)
            assert frames() == 1 and served() == before, (frames(), served(), before)
            pixels = (
                "id => "
                "Array.from(document.getElementById(id).getContext('2d').getImageData(0, "
                "0, 64, 64).data).join(',')"
            )
            frame0, model0, truth0 = (
                int(page.locator("#frame").inner_text()),
                page.evaluate(pixels, "model"),
                page.evaluate(pixels, "truth"),
            )
            frame_past = lambda n: page.wait_for_function(
                f"Number(document.getElementById('frame').textContent) > {n}", timeout=30_000
            )
            # held: frame after frame
            page.keyboard.down("ArrowUp")
            frame_past(frame0 + 2)
            page.keyboard.up("ArrowUp")
            page.keyboard.down("KeyD")
            frame_past(frame0 + 4)
            page.keyboard.up("KeyD")
            assert (
                page.evaluate(pixels, "truth") != truth0
                and page.evaluate(pixels, "model") != model0
            )
            fps = page.locator("#fps").inner_text()
            lat = page.locator("#latency").inner_text()
            # fps: "–" when frames are over a second apart
            assert (fps == "–" or float(fps) > 0) and float(lat) > 0, (fps, lat)
            assert (
                float(page.locator("#engine").inner_text()) >= 0
                and int(page.locator("#batch").inner_text()) >= 1
            )

            # once the frame in flight (if any) is in: no further requests
            def settled() -> int:
                page.wait_for_function("document.body.dataset.waiting === 'no'", timeout=60_000)
                n = frames()
                page.wait_for_timeout(700)
                assert frames() == n and page.evaluate("document.body.dataset.waiting") == "no", (
                    frames(),
                    n,
                )
                return n

            # keys released: it stops asking
            n = settled()
            truth1 = page.evaluate(pixels, "truth")
            # a menu change: exactly one frame
            page.select_option("#theme", "neon")
            page.wait_for_function(f"Number(document.body.dataset.frames) > {n}", timeout=30_000)
            assert settled() == n + 1 and page.evaluate(pixels, "truth") != truth1
            canvas_px = page.evaluate(
                "document.getElementById('model').getBoundingClientRect().width"
            )
            # upscaled, not 64 px
            assert canvas_px >= 64 * 4
            page.screenshot(path=str(tmp_path / "play.png"))
            assert (tmp_path / "play.png").stat().st_size > 10_000
        finally:
            browser.close()
    assert outside == [], outside
    assert errors == [], errors


@needs_chromium
def test_the_page_plays_again_after_an_idle_close(idle_server):
    """A tab left alone: the server closes its session (1001), the page says it paused, and the next
    key press plays again."""
    with chromium_page() as page:
        page.goto(idle_server + "/")
        page.wait_for_function("Number(document.body.dataset.frames || 0) >= 1", timeout=60_000)
        page.wait_for_function(
            "document.getElementById('status').textContent.startsWith('paused (idle')",
            timeout=30_000,
        )
        assert (
            page.locator("#status").inner_text()
            == f"paused (idle {IDLE_S:g} s): press a key to play again"
        )
        page.keyboard.press("ArrowUp")
        page.wait_for_function("Number(document.body.dataset.frames) >= 2", timeout=30_000)
        assert page.locator("#status").inner_text() == "playing"
    # a new session, not the old one
    assert httpx.get(f"{idle_server}/metrics").json()["counts"]["play sessions"] >= 2


@needs_chromium
def test_serve_without_a_checkpoint_plays_the_shipped_model_and_says_how_good_it_is(tmp_path):
    """`qmind serve` with no arguments: the model that ships with the package, its test-cell PSNR on
    the page."""
    with qmind_serve("--backend", "bf16") as (url, log):
        info = httpx.get(f"{url}/info", timeout=10).json()
        held = summary_psnr({"heldout": info["heldout_psnr"]}, "heldout")
        assert info["source"] == "shipped:small" and held[1] > info["heldout_psnr"]["baseline"]
        # played at its headline step count, chosen on the validation cells: one step
        assert info["steps"] == 1 and info["heldout_cells"] == "test"
        with chromium_page() as page:
            page.goto(url + "/")
            page.wait_for_function("Number(document.body.dataset.frames || 0) >= 1", timeout=60_000)
            about = page.locator("#about").inner_text()
            assert (
                "shipped:small" in about and "Test-cell PSNR" in about and f"{held[1]:.2f}" in about
            ), about
    # the port open first, then the model loaded and warmed, then ready
    out = log["out"]
    assert "1 DDIM step(s) a frame, the model's headline step count" in out
    assert (
        out.index(f"listening on {url}/")
        < out.index("shipped:small (step")
        < out.index(f"ready: open {url}/")
    ), out[-3000:]


def test_ship_writes_an_evaluated_run_with_its_provenance(run_dir, tmp_path):
    from qmind_render.core.evaluate import evaluate
    from qmind_render.core.checkpoint import WeightsError, content_hash, load_shipped
    from qmind_render.serve.renderer import ServeError, ship

    with pytest.raises(
        ServeError, match=r"no evaluation of 0000003.pt .*run `qmind eval .*` first"
    ):
        ship(run_dir, tmp_path / "never.pt")
    assert not (tmp_path / "never.pt").exists()
    ev = evaluate(
        run_dir,
        [
            "eval.ddim_steps=[1]",
            "eval.frames_per_cell=1",
            "eval.classifier_steps=30",
            "eval.temporal_walks=0",
        ],
        out=run_dir / "eval",
        log=lambda *a: None,
    )
    out = ship(run_dir, tmp_path / "shipped.pt", trained_on="this test")
    blob = torch.load(out, weights_only=True)
    assert all(v.dtype == torch.bfloat16 for v in blob["ema"].values() if v.is_floating_point())
    assert (
        summary_psnr(blob["metrics"], "heldout") == {1: round(ev.part("heldout").psnr(1), 2)}
        and blob["step"] == 3
    )
    # the headline step count is kept with the model, and a server of the run plays at it
    assert blob["metrics"]["headline_steps"] == ev.headline_steps == 1
    assert load_served(run_dir).headline_steps == 1
    assert (
        blob["trained"]["on"] == "this test"
        and blob["dataset"] == "ds-serve"
        and blob["reproduce"].startswith("qmind run ")
    )
    model, _, about = load_shipped(out)
    ref = load_served(run_dir).model.state_dict()
    # bf16 rounding
    assert all(
        (model.state_dict()[k] - v.float()).abs().max() <= v.float().abs().max() / 128 + 1e-8
        for k, v in ref.items()
    )
    # sealed as a checkpoint is: a copy with one weight changed is refused by load_shipped, as qmind
    # serve loads it no temporary file left
    assert blob["sha256"] == content_hash(blob) and not list(tmp_path.glob(".*"))
    k = next(k for k, v in blob["ema"].items() if v.is_floating_point())
    blob["ema"][k] = blob["ema"][k].clone()
    blob["ema"][k].view(-1)[0] += 1
    torch.save(blob, tmp_path / "edited.pt")
    with pytest.raises(WeightsError, match="edited.pt is corrupt"):
        load_shipped(tmp_path / "edited.pt")


# ---------------------------------------------------------------- the benchmark's code path
# (numbers are not tested)


def test_bench_serve_json_is_clean_and_complete(tmp_path):
    """`qmind bench serve --json` prints one JSON object on stdout (the server's and compiler's
    notes go to stderr)."""
    args = [
        "bench",
        "serve",
        "size=tiny",
        "patch=2",  # the trunk at half resolution: the same code path, a quarter of the work
        "steps=[1]",
        "clients=[1,2]",
        "seconds=0.5",
        "repeats=2",
        "compile=false",
        "--json",
    ]
    r = subprocess.run(
        CLI + args,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "QMIND_CACHE": str(tmp_path)},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    # auto, without a compiled package
    assert out["backend"] in ("eager", "bf16", "onnx") and "backend:" in r.stderr
    assert len(out["steps1_clients1_fps_runs"]) == 2 and all(
        f > 0 for f in out["steps1_clients2_fps_runs"]
    )
    assert out["steps1_clients1_mean_batch"] == 1.0 and out["steps1_throughput_ratio"] > 0
    assert out["steps1_clients2_p99_ms"] >= out["steps1_clients2_p50_ms"] > 0
    assert (
        out["device"] == "cpu"
        and out["render_backend"] in ("eager", "bf16", "onnx")
        and out["steps1_render_b1_ms"] > 0
    )
