"""The five-minute talks as reveal.js slides, opened in headless Chromium: reveal.js starts, three slides,
the equation typeset by MathJax, arrow keys move, and no request leaves the machine."""
from urllib.parse import urlparse

import pytest

from qmind_render.docs import serve_site
from qmind_render.talks import build_talks, check_offline
from tests.conftest import launch_chromium, needs_chromium

DECKS = ["autograd", "heldout"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    "The two decks built (executed) into a folder, served on 127.0.0.1; yields (url, folder, slide paths)."
    out = tmp_path_factory.mktemp("talks")
    paths = build_talks(out, only=DECKS, log=None)
    httpd = serve_site(out)
    yield f"http://127.0.0.1:{httpd.server_address[1]}", out, paths
    httpd.shutdown()
    httpd.server_close()


def test_build_writes_offline_decks_and_index(site):
    _, out, paths = site
    assert [p.name for p in paths] == [f"{d}.html" for d in DECKS]
    index = (out / "index.html").read_text()
    for p in paths:
        check_offline(p)
        assert f'href="{p.name}"' in index
        assert p.read_text().count("<section><section>") == 3   # three slides, each one reveal.js section
    assert (out / "_assets/reveal.js/dist/reveal.js").is_file() and (out / "_assets/mathjax/tex-chtml.js").is_file()


@needs_chromium
def test_decks_run_in_chromium_offline(site, tmp_path):
    from playwright.sync_api import sync_playwright
    url, _, _ = site
    host = urlparse(url).netloc
    requests, remote, failed, errors = [], [], [], []

    def route(r):
        requests.append(r.request.url)
        if urlparse(r.request.url).netloc == host: r.continue_()
        else: remote.append(r.request.url); r.abort()

    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1100, "height": 760})
        page.route("**/*", route)
        page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
        page.on("pageerror", lambda e: errors.append(str(e)))
        for deck in DECKS:
            page.goto(f"{url}/{deck}.html")
            page.wait_for_function("window.Reveal && Reveal.isReady()", timeout=20_000)
            assert page.evaluate("Reveal.getTotalSlides()") == 3, deck
            page.wait_for_function("document.body.dataset.mathjax === 'done'", timeout=30_000)
            assert page.locator("mjx-container[display='true']").count() >= 1, f"{deck}: no display equation typeset"
            assert page.locator(".slides img").count() >= 1, f"{deck}: no picture"
            assert page.evaluate("Reveal.getIndices().h") == 0
            page.keyboard.press("ArrowRight")
            page.wait_for_function("Reveal.getIndices().h === 1", timeout=5_000)
            shot = tmp_path / f"{deck}-slide2.png"
            page.screenshot(path=str(shot))
            assert shot.stat().st_size > 10_000
        page.goto(f"{url}/index.html")
        assert page.locator("a[href$='.html']").count() == len(DECKS)
        browser.close()
    assert not remote, f"requests left localhost: {remote}"
    assert not failed, f"failed requests: {failed}"
    assert not errors, f"page errors: {errors}"
    assert any("tex-chtml.js" in u for u in requests) and any("woff" in u for u in requests), "MathJax or its fonts never loaded"
