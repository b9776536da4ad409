"""The command line answers at once (issue 54 item 4): `qmind --help`, each command's `--help` and
the refusals that need no model load none of the heavy libraries (torch first: seconds to import),
which are imported where they are used; and one wall-clock check with a wide margin."""

import json
import subprocess
import sys
import time
from pathlib import Path

from qmind_render.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]

# what takes seconds to import, or pulls in what does
HEAVY = ("torch", "fastapi", "boto3", "matplotlib", "scipy", "numba", "nbformat", "papermill")
# commands whose module still imports torch (or nbdev) at its top: --help answers in seconds
STILL_SLOW = {
    "render": "serve.designed imports the renderer (torch) to patch it",
    "serve": "serve.settings and serve.app import the renderer (torch) and fastapi",
    "ship": "qmind ship's parser lives in serve.renderer (torch)",
    "docs": "docs.website subclasses nbdev's processors (IPython) at import",
}

# each argv through `qmind` in one process; after each, the heavy modules it loaded
RUN_EACH = (
    "import contextlib, io, json, sys\n"
    "from qmind_render.cli import main\n"
    "heavy, out = json.loads(sys.argv[2]), []\n"
    "for argv in json.loads(sys.argv[1]):\n"
    "    err, std = io.StringIO(), io.StringIO()\n"
    "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):\n"
    "        try:\n"
    "            rc = main(argv)\n"
    "        except SystemExit as e:\n"
    "            rc = e.code or 0\n"
    "    out.append([rc, err.getvalue(), [m for m in heavy if m in sys.modules]])\n"
    "print(json.dumps(out))\n"
)


def each(argvs: list[list[str]]) -> list:
    "[exit code, stderr, heavy modules loaded so far] after each of `argvs`, in one process."
    r = subprocess.run(
        [sys.executable, "-c", RUN_EACH, json.dumps(argvs), json.dumps(HEAVY)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_every_commands_help_loads_nothing_heavy():
    fast = [c for c in COMMANDS if c not in STILL_SLOW]
    assert set(STILL_SLOW) <= set(COMMANDS) and len(fast) >= 12, fast
    results = each([["--help"], *[[c, "--help"] for c in fast]])
    for argv, (rc, err, heavy) in zip([["--help"], *[[c, "--help"] for c in fast]], results):
        assert rc == 0, (argv, err)
        assert not heavy, f"qmind {' '.join(argv)} imported {heavy}"


def test_refusals_that_need_no_model_load_nothing_heavy(tmp_path):
    argvs = [
        ["run", "quikstart"],  # a missing file
        ["train", "quickstart", "train.stepz=5"],  # an unknown key
        ["train", "--no-such-option"],
        ["eval"],  # what to evaluate is missing
        ["themes", "--themes", "nope"],
        ["sweep", "quickstart", "-m", "seed=range(3,1)", "--dry-run"],
        ["cost", "quickstart", "train.lr=-1"],
        ["talks", "--no-such-option"],
    ]
    for argv, (rc, err, heavy) in zip(argvs, each(argvs)):
        assert rc == 2, (argv, rc, err)
        assert "Traceback" not in err and err.strip(), (argv, err)
        assert not heavy, f"qmind {' '.join(argv)} imported {heavy} to refuse"
    rc, err, _ = each([["run", "quikstart"]])[0]
    assert err.strip().splitlines() == [
        next(line for line in err.splitlines() if "config file not found" in line)
    ]


def test_the_themes_parser_knows_every_set_of_new_themes():
    from qmind_render.core.commands import THEME_SET_NAMES
    from qmind_render.core.new_themes import THEME_SETS

    assert THEME_SET_NAMES == tuple(THEME_SETS)


def _best_of(argv: list[str], n: int = 3) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=120, check=True)
        best = min(best, time.perf_counter() - t0)
    return best


def test_help_answers_within_a_second_of_a_bare_python():
    """Wall clock, with a margin no loaded machine should cross: the best of three runs within
    1 s plus ten bare interpreter starts (importing torch alone takes several seconds)."""
    argv = ["train", "--help"]
    bare = _best_of([sys.executable, "-c", "pass"])
    took = _best_of([sys.executable, "-m", "qmind_render.cli", *argv])
    assert took < 1.0 + 10 * bare, f"qmind {' '.join(argv)}: {took:.2f} s (python: {bare:.2f} s)"
