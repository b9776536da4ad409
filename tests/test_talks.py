"""The five-minute talks: every one built once (which runs its cells and asserts; `make nbtest`
leaves nbs/talks to this module, so no talk runs twice in a suite), then opened in headless
Chromium: reveal.js starts, each of its three slides is stepped through, its picture loads, MathJax
typesets its equation without a TeX error, the last slide is headed "Why it matters for
qmind-render", and no request leaves the machine. Besides: the deck's topics each have a talk,
numbered in the deck's order; a broken equation is seen as one; the pages' files ship in the
package."""

import base64
import fnmatch
import re
import time
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import nbformat
import nbformat.v4 as nbf
import pytest

import qmind_render
from qmind_render.docs.website import serve_site
from qmind_render.docs.talks import (
    DECK_TOPICS,
    TALK_ASSETS,
    WHY,
    build_talks,
    check_offline,
    find_talks,
    lineup,
)
from tests.conftest import block_off_host, launch_chromium, needs_chromium

FOLDER = Path(__file__).resolve().parents[1] / "nbs" / "talks"
SLUGS = [t.slug for t in find_talks(FOLDER)]


def test_every_deck_topic_has_a_talk():
    """The deck's fifteen topics each have their talk, at the number the deck gives it (fails until
    every talk is written)."""
    missing = [
        f"{t.n:02d}_{t.slug}.ipynb ({t.title})"
        for t in DECK_TOPICS
        if not (FOLDER / f"{t.n:02d}_{t.slug}.ipynb").is_file()
    ]
    assert not missing, (
        f"{len(missing)} of the deck's {len(DECK_TOPICS)} topics have no talk in "
        f"{FOLDER}: {missing}"
    )


def test_talks_are_numbered_in_the_deck_order():
    """A talk on a deck topic carries the topic's number; the other talks come after the deck's
    topics."""
    topics, extras = lineup(find_talks(FOLDER))
    for topic, talk in topics:
        if talk is not None:
            assert talk.path.name == f"{topic.n:02d}_{topic.slug}.ipynb", (topic, talk.path.name)
    assert {"strides", "compile"} <= {t.slug for t in extras}
    for t in extras:
        assert int(t.path.name.split("_")[0]) > len(DECK_TOPICS), t.path.name


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Every talk built (executed, two at a time) into one folder, served on 127.0.0.1; yields (url,
    folder, slide paths)."""
    out = tmp_path_factory.mktemp("talks")
    t0 = time.perf_counter()
    paths = build_talks(out, folder=FOLDER, jobs=2, log=None)
    print(f"\nbuilt {len(paths)} talks in {time.perf_counter() - t0:.1f} s")
    httpd = serve_site(out)
    yield f"http://127.0.0.1:{httpd.server_address[1]}", out, paths
    httpd.shutdown()
    httpd.server_close()


def test_build_writes_every_talk_offline_and_the_index_in_deck_order(site):
    _, out, paths = site
    assert [p.name for p in paths] == [f"{s}.html" for s in SLUGS]
    for p in paths:
        check_offline(p)
        # three slides, each one reveal.js section
        assert p.read_text().count("<section><section>") == 3, p.name
    index = (out / "index.html").read_text()
    hrefs = re.findall(r'<a href="([\w-]+)\.html"', index)
    topics, extras = lineup(find_talks(FOLDER))
    assert hrefs == [t.slug for _, t in topics if t] + [t.slug for t in extras]
    for topic, talk in topics:
        row = f'<li value="{topic.n}"' + ("" if talk else ' class="missing"')
        assert row in index and (
            talk or "no talk yet" in index[index.index(row) :].split("</li>")[0]
        ), topic
    assert (out / "_assets/reveal.js/dist/reveal.js").is_file() and (
        out / "_assets/mathjax/tex-chtml.js"
    ).is_file()


@pytest.fixture(scope="module")
def browser():
    "One headless Chromium for every talk."
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()


@pytest.fixture
def page(site, browser):
    """A fresh page that records every request (`page.urls`), aborts any that would leave 127.0.0.1,
    and keeps failures and JS errors."""
    ctx = browser.new_context(viewport={"width": 1100, "height": 760})
    pg = ctx.new_page()
    pg.urls, pg.failed, pg.errors = [], [], []
    block_off_host(pg)
    pg.on("request", lambda r: pg.urls.append(r.url))
    pg.on("response", lambda r: r.status >= 400 and pg.failed.append(f"{r.status} {r.url}"))
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    yield pg
    ctx.close()


def _off_machine(urls: list[str]) -> list[str]:
    return [
        u
        for u in urls
        if not (
            urlparse(u).scheme == "file"
            or (urlparse(u).scheme == "http" and urlparse(u).hostname == "127.0.0.1")
        )
    ]


# What the current slide shows: loaded PNG pictures (data: URLs, as nbconvert embeds a cell's
# figure) and typeset display equations, each counted only if it has a size on screen; TeX errors,
# which MathJax draws inside the equation (so a broken one still has an mjx-math): a parse error as
# mjx-merror, an undefined macro as its own name in red; TeX delimiters left in the text outside
# code; the slide's heading; how far its content runs past the slide's bottom edge.
_SHOWN = """() => {
  const s = Reveal.getCurrentSlide(), seen = e => e.getBoundingClientRect().width > 0 && e.getBoundingClientRect().height > 0;
  const prose = s.cloneNode(true);
  prose.querySelectorAll('pre, code, mjx-container, .jp-InputArea-editor').forEach(e => e.remove());
  const h = s.querySelector('h1, h2');
  return {
    pictures: [...s.querySelectorAll('img')].filter(i => i.src.startsWith('data:image/png') && i.complete && i.naturalWidth > 0 && seen(i)).length,
    equations: [...s.querySelectorAll("mjx-container[display='true']")].filter(m => seen(m) && m.querySelector('mjx-math')).length,
    tex_errors: s.querySelectorAll('mjx-math mjx-merror, mjx-math [data-mjx-error]').length
      + [...s.querySelectorAll('mjx-assistive-mml mtext[mathcolor="red"]')].filter(t => t.textContent.startsWith('\\\\')).length,
    raw_tex: ['$$', '\\\\[', '\\\\]', '\\\\(', '\\\\)'].filter(d => prose.textContent.includes(d)),
    heading: h ? h.textContent.replace('\u00b6', '').trim() : '',
    overflow_px: (() => {                 // how far the slide's content runs past the slide's bottom edge, in slide pixels
      const box = document.querySelector('.reveal .slides').getBoundingClientRect(), scale = box.height / Reveal.getConfig().height;
      const content = e => ['IMG', 'SVG', 'CANVAS', 'MJX-CONTAINER', 'TABLE'].includes(e.tagName.toUpperCase())
        || [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());     // pictures, equations and text, not padding
      const bottom = Math.max(box.top, ...[...s.querySelectorAll('*')].filter(e => seen(e) && content(e)).map(e => e.getBoundingClientRect().bottom));
      return Math.round((bottom - box.bottom) / scale);
    })(),
  };
}"""  # noqa: E501 (JavaScript run in the slide page)


@needs_chromium
@pytest.mark.parametrize("slug", SLUGS)
def test_talk_steps_through_its_slides_in_chromium_offline(site, page, slug):
    url = site[0]
    page.goto(f"{url}/{slug}.html")
    page.wait_for_function("window.Reveal && Reveal.isReady()", timeout=20_000)
    assert page.evaluate("Reveal.getTotalSlides()") == 3
    page.wait_for_function("document.body.dataset.mathjax === 'done'", timeout=30_000)
    shown = []
    for i in range(3):
        assert page.evaluate("Reveal.getIndices().h") == i
        shown.append(page.evaluate(_SHOWN))
        if i < 2:
            page.keyboard.press("ArrowRight")  # as a speaker moves on
            page.wait_for_function(f"Reveal.getIndices().h === {i + 1}", timeout=5_000)
    assert page.evaluate("Reveal.isLastSlide()")
    assert sum(s["pictures"] for s in shown) >= 1, f"{slug}: no picture shown on any slide: {shown}"
    assert sum(s["equations"] for s in shown) >= 1, (
        f"{slug}: no display equation typeset on any slide: {shown}"
    )
    assert not any(s["tex_errors"] for s in shown), (
        f"{slug}: MathJax could not typeset some TeX: {shown}"
    )
    assert not any(s["raw_tex"] for s in shown), f"{slug}: TeX left untypeset: {shown}"
    assert all(s["overflow_px"] <= 2 for s in shown), (
        f"{slug}: a slide runs off the bottom: {[s['overflow_px'] for s in shown]} px"
    )
    assert shown[2]["heading"].lower() == WHY.lower(), (
        f"{slug}: the last slide is headed {shown[2]['heading']!r}, not {WHY!r}"
    )
    assert not _off_machine(page.urls), (
        f"{slug}: requests left the machine: {_off_machine(page.urls)}"
    )
    assert not page.failed and not page.errors, (page.failed, page.errors)
    assert any("tex-chtml.js" in u for u in page.urls) and any("woff" in u for u in page.urls), (
        "MathJax or its fonts never loaded"
    )


@needs_chromium
def test_index_lists_every_talk_in_deck_order(site, page):
    topics, extras = lineup(find_talks(FOLDER))
    page.goto(f"{site[0]}/index.html")
    hrefs = page.eval_on_selector_all(
        "a[href$='.html']", "els => els.map(e => e.getAttribute('href'))"
    )
    assert hrefs == [f"{t.slug}.html" for _, t in topics if t] + [f"{t.slug}.html" for t in extras]
    numbers = page.eval_on_selector_all("ol > li", "els => els.map(e => e.value)")
    # a full build lists every topic, with or without a talk yet
    assert numbers == [t.n for t in DECK_TOPICS]
    assert not _off_machine(page.urls) and not page.errors


_PNG = base64.b64encode(
    base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    )
).decode()


@needs_chromium
def test_a_broken_equation_and_stray_tex_are_seen(browser, tmp_path):
    """The checks above would see what a reader would: TeX MathJax cannot parse, and a delimiter it
    never closed."""
    slide = lambda md: nbf.new_markdown_cell(md, metadata={"slideshow": {"slide_type": "slide"}})
    picture = nbf.new_code_cell(
        "show()",
        outputs=[
            nbf.new_output("display_data", data={"image/png": _PNG, "text/plain": "<Figure>"})
        ],
    )
    nb = nbf.new_notebook(
        cells=[
            slide("# Toy"),
            picture,
            slide("## Broken\n\n$$x = \\nosuchmacro{1}$$\n\n$$y^$$"),
            # markdown's \\( is \(
            slide(f"## {WHY}\n\nA stray \\\\(x, and $$\\frac{{1}}{{$$"),
        ]
    )
    (tmp_path / "talks").mkdir()
    nbformat.write(nb, tmp_path / "talks" / "01_toy.ipynb")
    # stored outputs: rendered, not run
    build_talks(tmp_path / "out", folder=tmp_path / "talks", log=None)
    httpd = serve_site(tmp_path / "out")
    try:
        ctx = browser.new_context(viewport={"width": 1100, "height": 760})
        pg = ctx.new_page()
        pg.goto(f"http://127.0.0.1:{httpd.server_address[1]}/toy.html")
        pg.wait_for_function(
            "window.Reveal && Reveal.isReady() && document.body.dataset.mathjax === 'done'",
            timeout=30_000,
        )
        shown = []
        for i in range(3):
            pg.evaluate(f"Reveal.slide({i})")
            shown.append(pg.evaluate(_SHOWN))
        ctx.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
    # drawn, but as errors
    assert shown[1]["tex_errors"] == 2 and shown[1]["equations"] == 2, shown
    # never opened or never closed
    assert shown[2]["raw_tex"] == ["$$", "\\("] and shown[2]["heading"] == WHY, shown
    assert shown[0]["pictures"] == 1 and not shown[0]["tex_errors"] and not shown[0]["raw_tex"], (
        shown
    )


def test_the_talk_pages_ship_in_the_package():
    """The slides' template and the index page are files under qmind_render/assets/ that the package
    data carries into a wheel."""
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["qmind_render"]
    for name in TALK_ASSETS:
        assert (Path(qmind_render.__file__).resolve().parent / "assets" / name).is_file(), name
        assert any(fnmatch.fnmatch(f"assets/{name}", p) for p in patterns), (name, patterns)
