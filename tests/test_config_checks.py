"""One check for every config, in every command (issue 54 items 3 and 9): whichever command loads a
config refuses the same bad value with the same one line and exit 2, before torch loads and before
anything is priced; a value that does not parse names the key and the place; Hydra's habits
(`+key=value`, `--cfg job`, `-m key=range(...)`) work."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from qmind_render.core.config import ConfigError, checked_config, load_config
from qmind_render.sweeps.sweep import expand_sweep, multirun, sweep_values

ROOT = Path(__file__).resolve().parents[1]

# the console script, and then whether torch was loaded (one more line on stderr)
RUN = (
    "import sys\n"
    "from qmind_render.cli import main\n"
    "try:\n"
    "    rc = main(sys.argv[1:])\n"
    "except SystemExit as e:\n"
    "    rc = e.code or 0\n"
    "print('torch loaded' if 'torch' in sys.modules else 'no torch', file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def qmind(*args, cwd=ROOT):
    "`qmind ARGS`: (exit code, stdout, stderr lines without the torch line, whether torch loaded)."
    r = subprocess.run(
        [sys.executable, "-c", RUN, *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    *err, last = r.stderr.splitlines() or [""]
    return r.returncode, r.stdout, err, last == "torch loaded"


# each command that takes a config from its user, as a user types it; BAD goes where {} is
COMMANDS = {
    "config": ["config", "quickstart", "{}"],
    "run": ["run", "quickstart", "{}"],
    "train": ["train", "quickstart", "{}"],
    "cost": ["cost", "quickstart", "{}"],
    "sweep": ["sweep", "quickstart", "-m", "seed=1,2", "{}", "--dry-run"],
    "aws": ["aws", "launch", "quickstart", "{}", "--dry-run"],
    "data": ["data", "gen", "quickstart", "{}"],
}
BAD = {
    "model.size=huge": "'model.size': 'huge' must be a size in SIZES: tiny, small, base",
    "data.holdout=nope": "data.holdout='nope': no split file",
    "eval.ddim_steps=[1,2": "the value of 'eval.ddim_steps', '[1,2', fails at its end",
}
# every bad value through one command in one process, then whether torch was loaded
RUN_EACH = (
    "import contextlib, io, json, sys\n"
    "from qmind_render.cli import main\n"
    "out = []\n"
    "for argv in json.loads(sys.argv[1]):\n"
    "    err, std = io.StringIO(), io.StringIO()\n"
    "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):\n"
    "        try:\n"
    "            rc = main(argv)\n"
    "        except SystemExit as e:\n"
    "            rc = e.code or 0\n"
    "    out.append([rc, std.getvalue(), err.getvalue().splitlines()])\n"
    "print(json.dumps([out, 'torch' in sys.modules]))\n"
)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_refuses_a_bad_config_the_same_way(cmd):
    import json

    argvs = [[bad if a == "{}" else a for a in COMMANDS[cmd]] for bad in BAD]
    r = subprocess.run(
        [sys.executable, "-c", RUN_EACH, json.dumps(argvs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    results, torch_loaded = json.loads(r.stdout)
    for (bad, want), (rc, out, err) in zip(BAD.items(), results):
        assert rc == 2, (cmd, bad, rc, out, err)
        assert len(err) == 1 and want in err[0], (cmd, bad, err)
        assert err[0].startswith(f"qmind {cmd}") and ": error: " in err[0], err
        assert "estimate" not in out and "runs:" not in out, f"qmind {cmd} priced {bad}"
    assert not torch_loaded, f"qmind {cmd} loaded torch to refuse a config"


def test_a_config_file_that_does_not_parse_is_one_line_with_its_place(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  steps: [1, 2\n")
    rc, _, err, _ = qmind("config", str(bad))
    assert rc == 2 and len(err) == 1, err
    assert str(bad) in err[0] and "line 3, column 1" in err[0] and "Traceback" not in err[0]


def test_an_override_that_does_not_parse_names_its_place():
    with pytest.raises(ConfigError, match=r"'train.lr', '\[1,\]\]', fails at character 5"):
        load_config(None, ["train.lr=[1,]]"])


def test_the_split_check_lists_the_splits_there_are_and_how_to_make_one():
    with pytest.raises(ConfigError) as e:
        checked_config("quickstart", ["data.holdout=nope"], root=ROOT)
    assert "balanced_20" in str(e.value) and "qmind data split nope" in str(e.value)
    assert checked_config("quickstart", ["data.holdout=coverage_50"], root=ROOT)


def test_a_size_registered_later_is_accepted():
    from qmind_render.core.config import SIZES, UNetSize

    SIZES["micro"] = UNetSize(width=8, mults=(1, 2), blocks=1, groups=4)
    try:
        assert load_config(None, ["model.size=micro"]).model.size == "micro"
    finally:
        del SIZES["micro"]
    with pytest.raises(ConfigError, match="model.size"):
        load_config(None, ["model.size=micro"])


# Hydra's habits


def test_plus_key_sets_a_key_and_an_unknown_one_is_refused_by_name():
    assert load_config(None, ["+seed=3", "++train.lr=1e-4"]).seed == 3
    rc, out, err, _ = qmind("config", "quickstart", "+seed=3")
    assert rc == 0 and yaml.safe_load(out)["seed"] == 3
    rc, _, err, _ = qmind("config", "quickstart", "+train.lrr=1")
    assert rc == 2 and "unknown key 'train.lrr' in override '+train.lrr=1'" in err[0]
    assert "did you mean 'train.lr'" in err[0]
    rc, _, err, _ = qmind("config", "quickstart", "~seed")
    assert rc == 2 and "cannot be deleted" in err[0]


@pytest.mark.parametrize("cmd", ["config", "train", "run"])
def test_cfg_job_prints_the_composed_config_and_runs_nothing(cmd):
    rc, out, err, torch_loaded = qmind(
        cmd, "quickstart", "seed=7", "+train.steps=3", "--cfg", "job"
    )
    assert rc == 0, err
    cfg = yaml.safe_load(out)
    assert (cfg["seed"], cfg["train"]["steps"], cfg["model"]["size"]) == (7, 3, "tiny")
    assert not torch_loaded, f"qmind {cmd} --cfg job loaded torch"


def test_multirun_takes_hydra_ranges_and_comma_lists():
    assert sweep_values("seed=range(0,3)") == [0, 1, 2]
    assert sweep_values("seed=range(1,7,2)") == [1, 3, 5]
    assert sweep_values("seed=3") is None
    s = multirun("quickstart", ["seed=range(0,3)", "train.lr=0.001,0.002", "+train.steps=5"])
    assert s["grid"] == {"seed": [0, 1, 2], "train.lr": [0.001, 0.002]}
    runs = expand_sweep(s, root=ROOT)
    assert len(runs) == 6 and {r.config["train"]["steps"] for r in runs} == {5}
    assert [r.config["seed"] for r in runs] == [0, 0, 1, 1, 2, 2]


def test_a_multirun_value_that_is_not_yaml_is_one_line():
    rc, _, err, _ = qmind("sweep", "quickstart", "-m", "eval.ddim_steps=[1,2],[3", "--dry-run")
    assert rc == 2 and len(err) == 1 and "is not valid YAML" in err[0], err
