"""Every command the README and the docs pages tell a reader to type runs as written.

Each shell command is taken from README.md (its ```sh blocks and its inline `qmind ...` spans) and
from the docs pages (the Markdown cells of nbs/**/*.ipynb: their ```sh blocks and inline `qmind
...`), then checked the cheapest way that still runs it:

- run as written (`AS_WRITTEN`), in this process (`qmind_render.cli.main`, the console script's
  function: one import of torch for all of them), in a scratch folder with its own store, on tiny
  data where the command reads a dataset (`ds-quickstart`, two episodes); the cost planner's
  measured figures and a sweep dry run's step times are stand-ins (measured in 85_cost and
  test_sweep: tens of seconds on 2 cores);
- what trains, evaluates, serves or benchmarks for minutes (a sweep without `--dry-run` too): its
  `--help` parses, its `key=value` overrides pass `qmind config` (the validation every command
  applies), the sweep file or experiment it names exists, the benchmark it names is one;
- what needs more than this machine (a GPU, an S3 store): the README says so beside it;
- `python tools/X.py` and `python -m MODULE`: `--help` parses; `make X`: the Makefile has X.

A command a page shows with placeholders (`qmind data verify ID --seal`) is checked as far as its
words go. The environment's tools (`jupyter`, `pip`, `nbdev-*`, `wandb`) are not checked here.

The README's first two commands (set up and run the main job; `make test`) are not run here: CI
runs `make test`, and `tests/test_pipeline.py` the main job.
"""

import contextlib
import io
import json
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# the README's two commands: set up and run the main job, and the tests (what CI runs)
NOT_RUN = {
    'pip install torch==2.13.0 && pip install -e ".[dev]" && qmind run quickstart',
    "make test",
}

# cheap enough to run exactly as written (a few seconds at most on 2 cores)
AS_WRITTEN = {
    "qmind --help",
    "qmind version",
    "qmind serve --help",
    "qmind config quickstart train.lr=1e-4 seed=2",
    "qmind render --seed 3 --frames 16 --out runs/render-3",
    "qmind data ls",
    "qmind data verify ds-quickstart",
    "qmind data repair ds-quickstart",
    "qmind data show ds-quickstart --split random_15",
    "qmind data split coverage_60",
    "qmind data split novelty2_75 --seed 1",
    "qmind data split theme_castle",
    "qmind data split coverage_75 --seed 2",
    "qmind cost quickstart model.size=base train.steps=200000 train.batch=64",
    "qmind cost gpu",
    "qmind aws launch quickstart data.store=s3://my-bucket/qmind --dry-run",
    "qmind sweep sweeps/coverage.yaml --status",
    "qmind sweep sweeps/coverage.yaml --dry-run",
    "qmind sweep quickstart -m seed=1,2,3 data.holdout=coverage_50,coverage_75 --dry-run",
}

# what needs more than a CPU machine: the README's line (command and comment) must say so
NEEDS = {r"^qmind run gpu|^qmind bench .*\bgpu\b|device=cuda": re.compile(r"GPU|CUDA|cuda")}

# named in the docs, but not for a reader to type
NOT_TYPED = {
    "qmind aws sagemaker-train",  # what the SageMaker container runs
    "qmind bench stage",  # how a new stage's benchmark will be run
}

# the environment's own tools, not the workbook's: not run here (test_jupyterlab starts JupyterLab)
FOREIGN = ("jupyter ", "pip ", "nbdev-", "wandb ")

# subcommands whose `key=value` arguments are config overrides (what `qmind config` validates)
CONFIG_TAKERS = {"train", "run", "eval", "cost", "gen"}

# a word that stands for what the reader fills in: `ID`, `RUN`, `sweeps/SWEEP.yaml`, `CMD:`, `...`,
# `[key=value ...]`, `local|slurm`
PLACEHOLDER = re.compile(r"(?:^|[/.\[])[A-Z][A-Z_]*(?:$|[/.:|\]])|^\.\.\.$|^\[|\|")


def _code_lines(text: str):
    "(command, comment) of every line of the ```sh/```bash blocks of Markdown `text`."
    for block in re.findall(r"```(?:sh|bash|shell)\n(.*?)```", text, re.S):
        for line in block.splitlines():
            cmd, _, comment = line.partition("  #")
            if cmd.strip() and not cmd.lstrip().startswith("#"):
                yield " ".join(cmd.split()), comment.strip()


def _inline_qmind(text: str):
    "Every inline `qmind ...` span of Markdown `text` (line breaks as spaces)."
    for span in re.findall(r"`(qmind[ \n][^`]*)`", text):
        yield " ".join(span.split())


def readme_commands() -> list[tuple[str, str, str]]:
    "(command, what is written beside it, where) for every command in the README."
    text = README.read_text()
    out = [(c, note, "README.md") for c, note in _code_lines(text)]
    return out + [(c, "", "README.md (inline)") for c in _inline_qmind(text)]


def docs_commands() -> list[tuple[str, str, str]]:
    "(command, comment, where) for every command in the docs pages' Markdown."
    out = []
    for nb in sorted((ROOT / "nbs").rglob("*.ipynb")):
        if ".ipynb_checkpoints" in nb.parts:
            continue
        text = "\n\n".join(
            "".join(c["source"])
            for c in json.loads(nb.read_text())["cells"]
            if c["cell_type"] == "markdown"
        )
        where = str(nb.relative_to(ROOT))
        out += [(c, note, where) for c, note in _code_lines(text)]
        out += [(c, "", where) for c in _inline_qmind(text)]
    return out


def _words_before_options(args: list[str]) -> list[str]:
    "The leading words of `args`: up to the first option, override or placeholder."
    out = []
    for a in args:
        if a.startswith("-") or "=" in a or PLACEHOLDER.search(a):
            break
        out.append(a)
    return out


def plan(cmd: str) -> list[tuple[str, object]]:
    """How `cmd` is checked: a list of ("qmind", argv) runs expected to exit 0, ("help", argv) runs
    expected to print a usage and exit 0, ("module", (name, argv)), ("tool", path) and ("file",
    path) checks. Empty: not a command to check (a reference such as `qmind CMD: error: ...`)."""
    if cmd in NOT_RUN | NOT_TYPED or cmd.startswith(FOREIGN):
        return []
    if "&&" in cmd:
        return [step for part in cmd.split("&&") for step in plan(part.strip())]
    words = shlex.split(cmd)
    if words[0] == "torchrun":
        m = words.index("-m")
        lead = _words_before_options(words[m + 2 :])
        return [("module", (words[m + 1], ["--help"]))] + _config_check(lead, words[m + 2 :])
    if words[:2] == ["python", "-m"]:
        return [("module", (words[2], ["--help"]))]
    if words[0] in ("python", "bash"):
        return [("tool" if words[0] == "python" else "file", words[1])]
    if words[0] == "make":
        return [("make", words[1])]
    assert words[0] == "qmind", cmd
    args = words[1:]
    if args and PLACEHOLDER.search(args[0]) or cmd.startswith("qmind --debug"):
        return []  # `qmind CMD ...`: how any command is written, not one to type
    if " | " in cmd and args[0] == "bench":  # `qmind bench engine | skinner | ...`: alternatives
        return [("bench", n) for n in cmd.split(None, 2)[2].split(" | ")]
    if cmd in AS_WRITTEN:
        return [("qmind", args)]
    if args[0] == "sweep" and args[1:] and not re.match(r"-|.*[A-Z]{2}", args[1]):
        # a sweep trains (its dry run, which expands every run's config, takes a second or more a
        # run): its flags parse, and its file or experiment exists
        return [("help", ["sweep", "--help"]), ("config file", args[1])]
    lead = _words_before_options(args)
    steps = [("help", lead + ["--help"])]
    named = [a for a in args[1:] if not a.startswith("-") and "=" not in a]
    if args[0] == "bench" and named and not PLACEHOLDER.search(named[0]):
        steps.append(("bench", named[0]))
    if set(lead) & CONFIG_TAKERS:
        steps += _config_check(lead[1:], args[len(lead) :])
    return steps


def _is_config(word: str) -> bool:
    "Whether `word` names a config or sweep file: a path that exists, or a name under sweeps/exp/."
    path = ROOT / word
    return (
        path.suffix in (".yaml", ".yml")
        and path.is_file()
        or (ROOT / "sweeps" / "exp" / f"{word}.yaml").is_file()
    )


def _config_check(words: list[str], rest: list[str]) -> list[tuple[str, object]]:
    """`qmind config CONFIG k=v ...`: the config among `words` (else quickstart) with the
    `key=value` overrides among `rest`, validated as every command validates them; none when the
    command names neither."""
    named = [w for w in words if _is_config(w)]
    kv = [a for a in rest if "=" in a and not a.startswith("-")]
    if any(PLACEHOLDER.search(a) for a in rest) or not (named or kv):
        return []
    return [("qmind", ["config", (named or ["quickstart"])[0], *kv])]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A folder to run the commands in, as a fresh clone would: the sweeps/ folder copied (a
    command may write a split there), `qmind_render` linked, its own store and cache, wandb
    offline; a tiny `ds-quickstart` (two episodes) in the store. Yields the folder."""
    work = tmp_path_factory.mktemp("readme")
    shutil.copytree(ROOT / "sweeps", work / "sweeps")
    (work / "qmind_render").symlink_to(ROOT / "qmind_render")
    env = {
        "QMIND_STORE": str(work / "qmind-store"),
        "QMIND_CACHE": str(work / "cache"),
        "QMIND_RUNS": str(work / "runs"),
        "WANDB_MODE": "offline",
    }
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.delenv("QMIND_DEBUG", raising=False)
        mp.chdir(work)
        # a sweep's dry run measures a training step of each config, and the cost planner its
        # model's FLOPs and activations (tens of seconds on 2 cores); their measurement is tested
        # in 85_cost and test_sweep, so here they are stand-in figures
        import qmind_render.sweeps.cost as cost

        mp.setattr(cost, "step_seconds", lambda cfg, threads=None, **kw: 0.05)
        mp.setattr(
            cost,
            "measure_model",
            lambda model_cfg, n=2: {
                "params": 1_000_000,
                "forward_flops": 1e9,
                "train_forward_ratio": 3.0,
                "activation_bytes_per_sample": 1e6,
            },
        )
        code, out = _qmind(
            ["data", "gen", "quickstart", "data.dataset=ds-quickstart", "data.episodes=2"]
        )
        assert code == 0, out
        yield work


def _qmind(argv: list[str]) -> tuple[int, str]:
    "(exit status, stdout and stderr) of `qmind ARGV`, run in this process."
    from qmind_render.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's --help and usage errors
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    return code, buf.getvalue()


def _as_main(run, argv: list[str]) -> tuple[int, str]:
    """(exit status, output) of `run()` (a `runpy` call: a module or script as `__main__`) with
    `sys.argv[1:]` = `argv`, in this process."""
    buf, old = io.StringIO(), sys.argv
    sys.argv = ["prog", *argv]
    try:
        with (
            contextlib.redirect_stdout(buf),
            contextlib.redirect_stderr(buf),
            warnings.catch_warnings(),
        ):
            # runpy warns that the package's module is imported already; --help needs no other copy
            warnings.simplefilter("ignore", RuntimeWarning)
            run()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        sys.argv = old
    return code, buf.getvalue()


def _check(step, cmd: str, where: str):
    kind, what = step
    label = f"{where}: `{cmd}`"
    if kind == "qmind":
        code, out = _qmind(what)
        assert code == 0, f"{label}: `qmind {shlex.join(what)}` exited {code}:\n{out[-2000:]}"
    elif kind == "help":
        code, out = _qmind(what)
        assert code == 0 and "usage" in out.lower(), f"{label}: `qmind {shlex.join(what)}`:\n{out}"
    elif kind == "module":
        name, argv = what
        code, out = _as_main(lambda: runpy.run_module(name, run_name="__main__"), argv)
        assert code == 0 and "usage" in out.lower(), (
            f"{label}: `python -m {what[0]} --help`:\n{out}"
        )
    elif kind == "tool":
        path = ROOT / what
        assert path.is_file(), f"{label}: no {what}"
        if "argparse" in path.read_text():
            run = lambda: runpy.run_path(str(path), run_name="__main__")
            code, out = _as_main(run, ["--help"])
            assert code == 0 and "usage" in out, f"{label}: `python {what} --help`:\n{out}"
    elif kind == "bench":
        from qmind_render.cli import BENCHES

        assert what in BENCHES, f"{label}: no benchmark {what!r} (qmind bench has {list(BENCHES)})"
    elif kind == "config file":
        assert _is_config(what), f"{label}: no file {what} (nor sweeps/exp/{what}.yaml)"
    elif kind == "file":
        assert (ROOT / what).is_file(), f"{label}: no {what}"
    elif kind == "make":
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
        assert what in targets, f"{label}: the Makefile has no target {what!r} ({targets})"


def test_every_readme_command_is_checked():
    "Each command of the README has a way to be checked, and the two not run are still there."
    cmds = readme_commands()
    assert len(cmds) > 40, cmds
    assert NOT_RUN <= {c for c, _, _ in cmds}, "the README's first two commands changed"
    written = {c for c, _, _ in cmds + docs_commands()}
    stale = sorted(c for c in AS_WRITTEN if c not in written)
    assert not stale, f"AS_WRITTEN names commands no page has: {stale}"


def test_commands_that_need_more_say_so_beside_them():
    "A README command that needs a GPU says so on its line (command or comment)."
    for cmd, note, where in readme_commands():
        if where != "README.md":
            continue  # inline spans sit in sentences about the GPU, if at all
        for needs, says in NEEDS.items():
            if re.search(needs, cmd):
                assert says.search(cmd + " " + note), f"{where}: `{cmd}` needs a GPU; say so"


def test_the_cloud_launch_says_it_needs_an_s3_store():
    "The cloud job's dry run names the S3 store a cloud job reads from, and runs as written."
    launch = [(c, n) for c, n, _ in readme_commands() if c.startswith("qmind aws launch")]
    assert launch and all("data.store=s3://" in c and "S3" in n for c, n in launch), launch


def _check_all(commands, checked: set):
    "Check every command's plan; a step several commands share (or the README's too) runs once."
    for cmd, _, where in commands:
        for step in plan(cmd):
            key = (step[0], json.dumps(step[1]))
            if key not in checked:
                checked.add(key)
                _check(step, cmd, where)


@pytest.fixture(scope="module")
def checked():
    "The steps already checked in this module."
    return set()


def test_readme_commands_run_as_written(scratch, checked):
    "Every README command: run, dry-run or `--help` (see the module's docstring), exit 0."
    _check_all(readme_commands(), checked)
    assert (scratch / "runs" / "render-3" / "map.png").is_file()
    assert (scratch / "sweeps" / "splits" / "coverage_60.yaml").is_file()


def test_docs_commands_run_as_written(scratch, checked):
    "Every command of the docs pages: run, dry-run or `--help` (as the README's), exit 0."
    _check_all(docs_commands(), checked)


def test_a_readme_command_runs_through_the_console_script(scratch):
    "The commands above ran through `qmind`'s function; one runs through the installed script."
    qmind = shutil.which("qmind")
    assert qmind, "no `qmind` on PATH: pip install -e '.[dev]'"
    r = subprocess.run(
        [qmind, "data", "ls"], capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert r.returncode == 0 and "ds-quickstart" in r.stdout, r.stdout + r.stderr
