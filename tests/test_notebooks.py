"""Every notebook's examples, run as `nbdev-test` runs them (nbdev's own `test_nb`: cells flagged
`slow` skipped, the talks left to test_talks.py, which runs each once), one test per notebook, so
pytest-xdist spreads the notebooks and the test files over one pool of workers instead of running
two pools one after the other."""

import io
import os
import sys
from pathlib import Path

import pytest
from nbdev.config import get_config
from nbdev.doclinks import nbglob

# (its test_nb imported by name would be collected as a test)
from nbdev import test as nbdev_test

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
# as `make nbtest`: nbdev's own folders, hidden ones, the talks
SKIP_FOLDERS = r"^(_|\.|talks$)"
NOTEBOOKS = sorted(nbglob(NBS, skip_folder_re=SKIP_FOLDERS, as_path=True))


def test_every_notebook_is_collected():
    """The glob finds the stage notebooks and nothing it should skip (a wrong pattern would quietly
    test nothing)."""
    names = {str(p.relative_to(NBS)) for p in NOTEBOOKS}
    assert {
        "00_contracts.ipynb",
        "core/50_train.ipynb",
        "serve/71_renderer.ipynb",
        "index.ipynb",
    } <= names, names
    assert not [n for n in names if n.startswith(("talks/", "_", "."))], names
    wings = [p for p in NBS.glob("*/*.ipynb") if p.parent.name != "talks"]
    assert len(names) == len(list(NBS.glob("*.ipynb"))) + len(wings)


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: str(p.relative_to(NBS)))
def test_notebook(nb: Path, monkeypatch):
    """The notebook's cells run in order without an error. What a notebook changes in this process
    (environment, working directory, sys.path, torch's thread count) is put back afterwards, so the
    next test on this worker starts clean."""
    import torch

    cfg = get_config(NBS)
    env, cwd, path, threads = dict(os.environ), os.getcwd(), list(sys.path), torch.get_num_threads()
    err = io.StringIO()
    # where nbdev's test_nb writes a failing cell's traceback
    monkeypatch.setattr(sys, "__stderr__", err)
    os.chdir(NBS)  # where nbdev-test runs from
    try:
        ok, _ = nbdev_test.test_nb(
            nb,
            skip_flags=cfg.tst_flags.split(),
            basepath=cfg.config_path,
            cell_timeout=int(cfg.get("cell_timeout", 600) or 600),
        )
    finally:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.path[:] = path
        torch.set_num_threads(threads)
    assert ok, f"{nb.relative_to(ROOT)} failed:\n{err.getvalue()[-6000:]}"
