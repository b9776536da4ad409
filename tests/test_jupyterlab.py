"""JupyterLab opens the workbook: it serves on loopback, has the python3 kernel and the ipywidgets
extension, and a widget made in a notebook renders in the browser."""

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port, launch_chromium, needs_chromium

ROOT = Path(__file__).resolve().parents[1]
WIDGETS = "@jupyter-widgets/jupyterlab-manager"


def _get(url, token=None, timeout=10):
    "(status, body) of a GET, with the token in the Authorization header if given."
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 serving a copy-free view of the repository; yields (url,
    token, workdir); always stopped."""
    home = tmp_path_factory.mktemp("jupyter")
    work = home / "work"
    # laid out as the repository, as far as the start page goes (qmind_render.docs.lab)
    (work / "nbs").mkdir(parents=True)
    (work / "nbs" / "index.ipynb").write_text(_notebook("# the start page"))
    (work / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    port, token = free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "IPYTHONDIR": str(home / "ipython"),
    }
    log = (home / "lab.log").open("w")
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={work}",
        "--ServerApp.disable_check_xsrf=False",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
        # what `make hooks` (an editable install) or a wheel's etc/jupyter enables for `jupyter lab`
        "--ServerApp.jpserver_extensions={'qmind_render.docs.lab': True}",
    ]  # no calls to PyPI or news feeds from a test
    if os.geteuid() == 0:
        cmd.append("--allow-root")  # CI containers run as root
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if _get(f"{url}/api/status", token, timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "jupyter lab did not start (exit "
                    f"{proc.poll()}):\n{(home / 'lab.log').read_text()[-3000:]}"
                )
            time.sleep(0.3)
        yield url, token, work
    finally:
        # jupyter_server shuts down its kernels and exits on SIGTERM
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


def test_lab_serves_the_jupyterlab_page(lab):
    url, token, _ = lab
    status, html = _get(f"{url}/lab?token={token}")
    assert status == 200
    assert "<title>JupyterLab</title>" in html or "JupyterLab" in html


def test_api_needs_the_token(lab):
    url, token, _ = lab
    assert _get(f"{url}/api/kernelspecs")[0] == 403
    assert _get(f"{url}/api/kernelspecs", "wrong-" + token)[0] == 403


def test_python3_kernel_is_available(lab):
    url, token, _ = lab
    status, body = _get(f"{url}/api/kernelspecs", token)
    assert status == 200
    specs = json.loads(body)
    assert "python3" in specs["kernelspecs"], sorted(specs["kernelspecs"])


def test_ipywidgets_lab_extension_is_installed_and_enabled(lab):
    url, token, _ = lab
    status, body = _get(f"{url}/lab/api/extensions", token)
    assert status == 200
    exts = {e["name"]: e for e in json.loads(body)}
    assert WIDGETS in exts, sorted(exts)
    assert exts[WIDGETS]["enabled"] and exts[WIDGETS]["installed"], exts[WIDGETS]


def test_labextension_list_shows_the_widgets_manager():
    r = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = r.stdout + r.stderr
    line = next((ln for ln in out.splitlines() if WIDGETS in ln), "")
    assert "enabled" in line and "OK" in line, out


def _wait_for_idle_kernel(url, token, timeout=90):
    "Wait until the server has a kernel (the one the notebook started) that is idle."
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = _get(f"{url}/api/kernels", token)
        if status == 200 and any(k["execution_state"] == "idle" for k in json.loads(body)):
            return
        time.sleep(0.5)
    raise TimeoutError(f"no idle kernel after {timeout} s: {_get(f'{url}/api/kernels', token)}")


@needs_chromium
def test_a_widget_renders_in_a_notebook(lab, tmp_path):
    """Open a notebook in JupyterLab in headless Chromium, run a cell that makes an IntSlider, and
    see the slider drawn."""
    from playwright.sync_api import sync_playwright

    url, token, work = lab
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": "w",
                "metadata": {},
                "outputs": [],
                "source": "import ipywidgets as w\nw.IntSlider(value=7, description='seven')",
            }
        ],
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (work / "widget.ipynb").write_text(json.dumps(nb))
    off_host = []
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})

            # watched, not intercepted: routing every request through Playwright keeps the kernel's
            # WebSocket from connecting
            def watch(u):
                if urllib.parse.urlsplit(u).hostname not in ("127.0.0.1", None):
                    off_host.append(u)

            page.on("request", lambda r: watch(r.url))
            page.on("websocket", lambda ws: watch(ws.url))
            page.goto(f"{url}/lab/tree/widget.ipynb?token={token}", timeout=60_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            _wait_for_idle_kernel(url, token)
            page.wait_for_selector(".jp-StatusBar-TextItem:has-text('Idle')", timeout=60_000)
            page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor").first.click()
            page.keyboard.press("Shift+Enter")
            slider = page.wait_for_selector(".jp-OutputArea .widget-slider", timeout=120_000)
            page.screenshot(path=str(tmp_path / "jupyterlab-widget.png"))
            assert (
                "seven" in slider.inner_text()
                or "seven" in page.locator(".jp-OutputArea").first.inner_text()
            )
            assert page.locator(".jp-OutputArea .widget-readout").first.inner_text().strip() == "7"
        finally:
            browser.close()
    assert not off_host, f"JupyterLab requested addresses off this machine: {off_host[:5]}"


def _notebook(source: str) -> str:
    "A one-cell notebook holding `source`, as JSON."
    cell = {
        "cell_type": "code",
        "execution_count": None,
        "id": "c",
        "metadata": {},
        "outputs": [],
        "source": source,
    }
    kernel = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb = {"cells": [cell], "metadata": {"kernelspec": kernel}, "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(nb)


# the pixels an <img> shows (not its src: an ipywidgets Image gets a new blob: URL on every update,
# the same picture or not)
PIXELS = """img => {
  const c = document.createElement("canvas");
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  c.getContext("2d").drawImage(img, 0, 0);
  return c.toDataURL();
}"""


def _drawn(page, timeout=180_000):
    "The pixels of the first picture in the notebook's output, once one has loaded."
    img = page.wait_for_selector(".jp-OutputArea img", timeout=timeout)
    page.wait_for_function("i => i.complete && i.naturalWidth > 0", arg=img, timeout=timeout)
    return img.evaluate(PIXELS)


def _redrawn(page, before, timeout=120_000):
    "The pixels of the output's picture once they differ from `before`."
    page.wait_for_function(
        f"prev => {{ const i = document.querySelector('.jp-OutputArea img');"
        f" return i && i.complete && i.naturalWidth > 0 && ({PIXELS})(i) !== prev; }}",
        arg=before,
        timeout=timeout,
    )
    return page.locator(".jp-OutputArea img").first.evaluate(PIXELS)


def _widget_draws_and_redraws(lab, tmp_path, name, source, move):
    """Open a notebook whose one cell is `source` in JupyterLab in headless Chromium, run it, see a
    picture in its output, `move(page)` a control, and see the picture change."""
    from playwright.sync_api import sync_playwright

    url, token, work = lab
    (work / f"{name}.ipynb").write_text(_notebook(source))
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            # a workspace of its own, reset: only this notebook open, whichever test ran before
            where = f"{url}/lab/workspaces/{name}/tree/{name}.ipynb"
            page.goto(f"{where}?token={token}&reset", timeout=60_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            _wait_for_idle_kernel(url, token)
            page.wait_for_selector(".jp-StatusBar-TextItem:has-text('Idle')", timeout=60_000)
            page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor").first.click()
            page.keyboard.press("Shift+Enter")
            before = _drawn(page)
            page.screenshot(path=str(tmp_path / f"{name}-before.png"))
            move(page)
            after = _redrawn(page, before)
            page.screenshot(path=str(tmp_path / f"{name}-after.png"))
            errors = page.locator(".jp-OutputArea-output[data-mime-type*='error']").count()
        finally:
            browser.close()
    assert before != after
    assert errors == 0


def _choose(page, label: str, option: str):
    "Pick `option` in the output's dropdown named `label` (an ipywidgets Dropdown is a <select>)."
    box = page.locator(".jp-OutputArea .widget-dropdown", has=page.get_by_text(label, exact=True))
    box.locator("select").select_option(label=option)


@needs_chromium
def test_explore_draws_and_redraws_in_jupyterlab(lab, tmp_path):
    "`explore()` shows the frame it picks, and draws another when a control moves."
    _widget_draws_and_redraws(
        lab,
        tmp_path,
        "explore",
        "from qmind_render.world.explorer import explore\nexplore()",
        lambda page: _choose(page, "theme", "neon"),
    )


@needs_chromium
def test_design_explorer_draws_and_redraws_in_jupyterlab(lab, tmp_path):
    "`design_explorer()` shows the skinner's frame and the model's, and redraws them on a change."
    _widget_draws_and_redraws(
        lab,
        tmp_path,
        "design",
        "from qmind_render.serve.designed import design_explorer\ndesign_explorer()",
        lambda page: _choose(page, "lighting", "moonlight"),
    )


def test_lab_opens_on_the_workbooks_start_page(lab):
    """`/`, and the address `jupyter lab` prints, lead to nbs/index.ipynb in a folder laid out as
    this repository; the extension that does it is enabled by a file the package installs."""
    url, token, _ = lab
    req = urllib.request.Request(f"{url}/?token={token}", method="GET")
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        opener.open(req, timeout=10)
        raise AssertionError("/ did not redirect")
    except urllib.error.HTTPError as e:
        assert e.code == 302, e.code
        assert urllib.parse.urlsplit(e.headers["Location"]).path == "/lab/tree/nbs/index.ipynb"
    status, html = _get(f"{url}/lab/tree/nbs/index.ipynb", token)
    assert status == 200 and "JupyterLab" in html
    enable = json.loads(
        (ROOT / "jupyter-config/jupyter_server_config.d/qmind_render.json").read_text()
    )
    assert enable["ServerApp"]["jpserver_extensions"] == {"qmind_render.docs.lab": True}
    assert (
        "jupyter-config/jupyter_server_config.d/qmind_render.json"
        in (ROOT / "pyproject.toml").read_text()
    )


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None
