"""Shared fixtures: a real S3 API (moto_server) on loopback, started and stopped by the tests;
Debian's Chromium for the browser tests."""

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make pytest` runs the files on one worker per core (pytest-xdist): each worker, and every
    # process it starts, gets one intra-op thread, so the workers share the cores instead of
    # stalling each other's OpenMP threads.
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


# The order pytest-xdist hands out work (`make pytest`: --dist loadgroup --no-loadscope-reorder):
# the heaviest first, so the long ones start early and short ones fill the end. A test file goes to
# one worker whole (its module fixtures are made once); each notebook of test_notebooks.py is a unit
# of its own. Seconds on one worker of 2 AVX2 cores: the 2026-12-02 figures, and where a unit was
# missing or has grown since, the run of 2026-12-07 (--durations=60; it shared the cores with
# another job, so its figures are divided by 2.4, what it took for the units both runs measured).
# 89_results, not listed then, ran last and alone for minutes. What is not listed follows, in
# collection order.
HEAVY_FIRST = {
    "test_train.py": 282,
    "test_notebook[sweeps/89_results.ipynb]": 261,
    "test_evaluate.py": 200,
    "test_results.py": 150,
    "test_talks.py": 132,
    "test_docs.py": 126,
    "test_serve.py": 122,
    "test_sweep.py": 115,
    "test_notebook[serve/71_renderer.ipynb]": 97,
    "test_notebook[core/45_warmup_digits.ipynb]": 78,
    "test_notebook[core/57_yardsticks.ipynb]": 76,
    "test_yardsticks.py": 76,
    "test_sweep_backends.py": 67,
    "test_cloud.py": 60,
    "test_notebook[77_gpu.ipynb]": 50,
    "test_config_defaults.py": 47,
    "test_model.py": 45,
    "test_jupyterlab.py": 40,
    "test_designed.py": 40,
    "test_notebook[core/60_evaluate.ipynb]": 39,
    "test_workbook.py": 39,
    "test_engine.py": 35,
    "test_notebook[core/65_pipeline.ipynb]": 35,
    "test_notebook[docs/96_website.ipynb]": 33,
    "test_notebook[core/41_diffusion.ipynb]": 32,
    "test_data_cli.py": 31,
    "test_notebook[docs/98_deck_numbers.ipynb]": 26,
    "test_notebook[core/50_train.ipynb]": 25,
    "test_notebook[world/10_engine.ipynb]": 24,
    "test_cli.py": 22,
    "test_notebook[sweeps/85_cost.ipynb]": 21,
    "test_restamp.py": 20,
    "test_notebook[core/52_steps.ipynb]": 16,
    "test_notebook[sweeps/88_sweep_cli.ipynb]": 16,
    "test_notebook[docs/95_talks.ipynb]": 15,
}


def _unit(item) -> str:
    "What goes to one worker whole: a notebook's test, or a test file."
    return (
        item.name
        if item.path.name == "test_notebooks.py" and item.name.startswith("test_notebook[")
        else item.path.name
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_unit(item)))
    # stable: a file's tests keep their order
    items.sort(key=lambda item: -HEAVY_FIRST.get(_unit(item), 0))


# what a skipped test lacked, by a word of its reason, and the one command that installs it
INSTALLS = {"chromium": "make deps", "slurm": "make deps", "npm": "make deps", "g++": "make deps"}


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    """The run ends by naming the tests it skipped, each reason once with its count, and the command
    that installs what they need (`make deps`, as .ci/run does first): after pytest's own summary
    (this wrapper is the outermost, so it writes last)."""
    yield
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons = {}
    for r in skipped:
        why = r.longrepr[2] if isinstance(r.longrepr, tuple) else str(r.longrepr)
        reasons.setdefault(why.removeprefix("Skipped: "), []).append(r.nodeid)
    w = terminalreporter.write_line
    w(f"skipped {len(skipped)} test(s):")
    for why, ids in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
        w(f"  {len(ids):3d}  {why}  (e.g. {ids[0]})")
    fixes = sorted({c for why in reasons for k, c in INSTALLS.items() if k in why.lower()})
    if fixes:
        w(f"to run them: {' && '.join(fixes)}  (installs what they need), then make test")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)"
)


def launch_chromium(playwright):
    """Debian's Chromium, headless, with nothing phoning home (Playwright's own browsers are not
    installed)."""
    return playwright.chromium.launch(
        executable_path=CHROMIUM,
        args=[
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-quic",
        ],
    )


# Any URL but this machine's (http(s) on 127.0.0.1, data:, blob:). Only these are routed to a Python
# handler; the site's own requests go straight through, without a round trip to Python each (about 4
# s of the docs' every-page test).
OFF_HOST_URL = re.compile(r"^(?!(?:https?://127\.0\.0\.1(?:[:/]|$)|data:|blob:))")


def block_off_host(page) -> list[str]:
    """Abort every request of `page` that would leave 127.0.0.1; returns the list in which their
    URLs are recorded."""
    urls = []

    def abort(route):
        urls.append(route.request.url)
        route.abort()

    page.route(OFF_HOST_URL, abort)
    return urls


@contextlib.contextmanager
def chromium_page():
    "A fresh page in Debian's Chromium (launch_chromium); the browser closes when the block ends."
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            yield browser.new_page()
        finally:
            browser.close()


@pytest.fixture(scope="session")
def moto_server():
    """The URL of a moto_server on 127.0.0.1 (S3, EC2, Budgets, SageMaker, Batch), for this test
    session."""
    port = free_port()
    proc = subprocess.Popen(
        ["moto_server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto_server did not start") from None
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def aws_env(moto_server, monkeypatch):
    "Point boto3 at the local server with throwaway credentials."
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    return moto_server


@pytest.fixture
def s3_bucket(aws_env, request):
    "A fresh bucket on the local S3 server; yields its name."
    import boto3

    name = f"qmind-test-{abs(hash(request.node.nodeid)) % 10**8}-{os.getpid()}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name
