"""The workbook's own machinery: the sync check CI relies on, papermill's tag through nbdev-clean,
and the chapters' pictures (every stage notebook ends with its picture, stored; drawing never goes
through pyplot)."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from code_stats import notebooks  # noqa: E402


@pytest.fixture
def workbook(tmp_path):
    "A copy of the notebooks, the generated package and the config, to break on purpose."
    for d in ("nbs", "qmind_render", "contracts", ".ci"):
        shutil.copytree(
            ROOT / d,
            tmp_path / d,
            symlinks=True,
            ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"),
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def check_sync(root):
    return subprocess.run(
        ["bash", ".ci/check_sync"], cwd=root, capture_output=True, text=True, timeout=120
    )


def test_sync_check_passes_on_a_clean_copy(workbook):
    r = check_sync(workbook)
    assert r.returncode == 0, r.stderr


def test_sync_check_fails_when_a_module_was_edited_by_hand(workbook):
    with (workbook / "qmind_render" / "core" / "config.py").open("a") as f:
        f.write("\nHAND_EDIT = 1\n")
    r = check_sync(workbook)
    assert r.returncode == 1
    assert "qmind_render/core/config.py" in r.stderr


def test_sync_check_fails_on_an_unclean_notebook(workbook):
    nb_path = workbook / "nbs" / "core" / "01_config.ipynb"
    nb = json.loads(nb_path.read_text())
    nb["cells"][0]["metadata"]["collapsed"] = True  # the kind of noise Jupyter adds
    nb["cells"][0]["execution_count"] = 7 if nb["cells"][0]["cell_type"] == "code" else None
    nb_path.write_text(json.dumps(nb, indent=1))
    r = check_sync(workbook)
    assert r.returncode == 1
    assert "nbs/core/01_config.ipynb" in r.stderr


def _notebook(cells):
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "python3", "language": "python", "name": "python3"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def test_parameters_tag_survives_nbdev_clean_and_papermill_uses_it(tmp_path):
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "nbs").mkdir()
    nb_path = tmp_path / "nbs" / "experiment.ipynb"
    cells = [
        {
            "cell_type": "code",
            "id": "a1",
            "execution_count": 3,
            "outputs": [],
            "source": ["lr = 0.1"],
            "metadata": {"tags": ["parameters"], "scrolled": True},
        },
        {
            "cell_type": "code",
            "id": "a2",
            "execution_count": 4,
            "outputs": [],
            "source": ["open('result.txt', 'w').write(str(lr))"],
            "metadata": {},
        },
    ]
    nb_path.write_text(json.dumps(_notebook(cells)))
    subprocess.run(["nbdev-clean", "--fname", str(nb_path)], cwd=tmp_path, check=True, timeout=60)
    cleaned = json.loads(nb_path.read_text())
    # volatile keys gone, tag kept
    assert cleaned["cells"][0]["metadata"] == {"tags": ["parameters"]}
    assert cleaned["cells"][0]["execution_count"] is None
    out = tmp_path / "out.ipynb"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "papermill",
            str(nb_path),
            str(out),
            "-p",
            "lr",
            "0.5",
            "--cwd",
            str(tmp_path),
            "-k",
            "python3",
        ],
        check=True,
        timeout=180,
        capture_output=True,
    )
    assert (tmp_path / "result.txt").read_text() == "0.5"


def test_every_notebook_is_valid_nbformat():
    """nbformat's own validation (cell ids included): an empty id passes nbdev-clean but stops the
    docs build."""
    import nbformat

    for p in sorted((ROOT / "nbs").rglob("*.ipynb")):
        if ".ipynb_checkpoints" in p.parts:
            continue
        nbformat.validate(nbformat.read(p, as_version=4))


# The notebooks in nbs/ that are not stages of the system, so end with no picture: the foundations
# before the picture stage exists (contracts, helpers, configs, the dataset recipe, the device), the
# stores (where bytes live: a folder or a bucket, nothing of the system's to draw), the server's
# chapters around its app (the wire protocol, the settings, running it: the app's chapter draws the
# server's frame), what a run reports (the run's curve and samples are the training chapter's
# picture), the workbook's own tooling, and the landing page.
NOT_STAGES = {
    "00_contracts",
    "00_util",
    "01_config",
    "02_device",
    "03_commands",
    "29_recipe",
    "30_stores",
    "49_tracking",
    "70_protocol",
    "73_settings",
    "75_server",
    "90_cli",
    "93_lab",
    "94_runner",
    "95_talks",
    "96_website",
    "98_deck_numbers",
    "index",
}
# Notebooks that may name pyplot, and why: neither draws with it.
PYPLOT_OK = {
    "05_viz": "checks that drawing leaves pyplot's list of figures empty",
    "95_talks": "its toy talk draws with pyplot, as the talks do, to check that the talk "
    "kernel captures the figure",
}


def _notebooks() -> dict[str, dict]:
    "The chapters (the wings' notebooks; talks/ and experiments/ are folders of their own)."
    return {p.stem: json.loads(p.read_text()) for p in notebooks()}


def _code(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _tagged(cell: dict) -> bool:
    return "picture" in cell.get("metadata", {}).get("tags", [])


def _output(cell: dict) -> bool:
    return "output" in cell.get("metadata", {}).get("tags", [])


def test_no_stage_notebook_draws_with_pyplot():
    """Pictures are viz's Figures and arrays: no notebook in nbs/ imports or calls pyplot (its
    global state is a notebook's backend)."""
    found = [
        f"{name} cell {c['id']}"
        for name, nb in _notebooks().items()
        if name not in PYPLOT_OK
        for c in _code(nb)
        if re.search(r"pyplot|\bplt\.", "".join(c["source"]))
    ]
    assert not found, (
        f"pyplot in {found}: draw with qmind_render.viz (figure_of, grid_figure, lines, bars, ...)"
    )


def test_every_stage_notebook_ends_with_its_stored_picture():
    """Each stage notebook's last code cell is tagged `picture` and stores an image (`make
    pictures`), so GitHub shows it."""
    nbs = {k: v for k, v in _notebooks().items() if k not in NOT_STAGES}
    assert len(nbs) >= 30
    untagged = [name for name, nb in nbs.items() if not _tagged(_code(nb)[-1])]
    assert not untagged, f"last code cell not tagged `picture` in {untagged}"
    bare = [
        name
        for name, nb in nbs.items()
        if not any(
            k.startswith("image/") for o in _code(nb)[-1]["outputs"] for k in o.get("data", {})
        )
    ]
    assert not bare, (
        f"no stored picture in {bare}: run `make pictures` (or python tools/pictures.py "
        "nbs/NAME.ipynb) and commit"
    )


def test_only_picture_cells_store_outputs():
    """Outputs are stored for the cells tagged `picture` (PNGs at 80 dpi, large ones in 128
    colours) and `output` (a small text where it teaches) alone, so notebooks stay small."""
    stored = {
        name: sum(len(json.dumps(c["outputs"])) for c in _code(nb))
        for name, nb in _notebooks().items()
    }
    extra = [
        f"{name} cell {c['id']}"
        for name, nb in _notebooks().items()
        for c in _code(nb)
        if c["outputs"] and not (_tagged(c) or _output(c))
    ]
    # an `output` cell keeps a small text (a table, a printed shape) where it teaches
    loud = [
        f"{name} cell {c['id']}"
        for name, nb in _notebooks().items()
        for c in _code(nb)
        if _output(c)
        and (
            len(json.dumps(c["outputs"])) > 4_000
            or any("image/png" in o.get("data", {}) for o in c["outputs"])
        )
    ]
    assert not loud, f"an `output` cell keeps a small text, not a picture: {loud}"
    assert not extra, (
        f"outputs stored in untagged cells {extra}: clear them (tools/pictures.py keeps "
        "only the tagged ones)"
    )
    big = {k: v for k, v in stored.items() if v > 250_000}
    assert not big, f"stored outputs over 250 kB: {big}: draw the picture smaller"
    assert sum(stored.values()) < 2_500_000


def test_the_run_ends_by_naming_what_it_skipped_and_how_to_install_it(tmp_path):
    """A run whose tests skip for a missing browser ends with the skipped tests, each reason once
    with its count, and the one command that installs what they need (`make deps`)."""
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n"
        'def test_a():\n    pytest.skip("needs Debian\'s chromium (apt-get install chromium)")\n'
        'def test_b():\n    pytest.skip("needs Debian\'s chromium (apt-get install chromium)")\n'
        "def test_c():\n    pytest.skip('needs CUDA')\n"
        "def test_d():\n    pass\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "tests.conftest"]
        + ["-p", "no:cacheprovider", str(tmp_path / "test_skips.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    tail = r.stdout.strip().splitlines()
    assert r.returncode == 0, r.stdout[-2000:]
    at = next(i for i, line in enumerate(tail) if line.startswith("skipped 3 test(s):"))
    assert "2  needs Debian's chromium" in tail[at + 1] and "1  needs CUDA" in tail[at + 2]
    assert tail[at + 3].startswith("to run them: make deps")
    assert "passed" in tail[-1] and at + 4 == len(tail) - 1  # nothing but pytest's count after it
