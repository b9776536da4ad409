"""The `qmind` console script as a user runs it: a real subprocess, exit codes, stderr."""

import json
import subprocess
import sys

import pytest

from qmind_render.cli import COMMANDS

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def qmind(*args, cwd=ROOT):
    exe = [sys.executable, "-c", "import sys; from qmind_render.cli import main; sys.exit(main())"]
    return subprocess.run(exe + list(args), cwd=cwd, capture_output=True, text=True, timeout=120)


def test_console_script_is_installed():
    r = subprocess.run(["qmind", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("qmind-render ")


def test_python_dash_m_runs_the_cli():
    r = subprocess.run(
        [sys.executable, "-m", "qmind_render.cli", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "invalid choice: 'nope'" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "qmind_render.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.startswith("qmind-render ")


def test_help_lists_every_subcommand():
    r = qmind("--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())  # argparse wraps long help lines
    for name, cmd in COMMANDS.items():
        assert f" {name} " in text and cmd.help in text


@pytest.mark.parametrize(
    "argv", [[], ["renderr"], ["config", "--no-such-flag"], ["version", "extra"]]
)
def test_argument_errors_exit_2_with_usage(argv):
    r = qmind(*argv)
    assert r.returncode == 2
    assert "usage: qmind" in r.stderr
    assert "Traceback" not in r.stderr


def test_version_json_names_the_contracts():
    r = qmind("version", "--json")
    v = json.loads(r.stdout)
    assert r.returncode == 0 and v["channel_spec"] == "0.1.1" and v["theme_schema"] == "0.1.1"


def test_config_resolves_file_and_overrides():
    r = qmind("config", "quickstart", "train.lr=1e-4", "seed=2", "--json")
    assert r.returncode == 0, r.stderr
    cfg = json.loads(r.stdout)
    assert cfg["train"]["lr"] == 1e-4 and cfg["seed"] == 2 and cfg["name"] == "quickstart"


def test_config_store_defaults_to_env(monkeypatch, tmp_path):
    monkeypatch.setenv("QMIND_STORE", str(tmp_path))
    cfg = json.loads(qmind("config", "--json").stdout)
    assert cfg["data"]["store"] == str(tmp_path)


@pytest.mark.parametrize(
    "yaml_text, argv, expect",
    [
        ("train:\n  lrr: 0.1\n", [], "unknown key 'train.lrr' in {path}; did you mean 'train.lr'?"),
        ("train:\n  steps: many\n", [], "bad value for 'train.steps' in {path}"),
        ("model:\n  material_enc: onehot\n", [], "expected one of [one_hot, embedding]"),
        ("- a list\n", [], "a config file is a YAML mapping"),
        ("train: {steps: 3\n", [], "not valid YAML"),
        ("seed: 1\n", ["seed=1.5"], "bad value for 'seed' in override 'seed=1.5'"),
        ("seed: 1\n", ["nmae=x"], "did you mean 'name'?"),
    ],
)
def test_bad_config_is_one_clear_line(tmp_path, yaml_text, argv, expect):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml_text)
    r = qmind("config", str(path), *argv)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert expect.format(path=path) in r.stderr


def test_missing_config_file_lists_what_exists():
    r = qmind("config", "no_such_experiment")
    assert r.returncode == 2
    assert "config file not found: sweeps/exp/no_such_experiment.yaml" in r.stderr
    assert "quickstart" in r.stderr


def test_options_anywhere_and_project_files_from_any_folder(tmp_path):
    """Flags after key=value (and key=value after flags) work, and experiments and splits are found
    outside the checkout."""
    # from a folder with no sweeps/
    r = qmind("config", "quickstart", "--json", "seed=5", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cfg = json.loads(r.stdout)
    assert cfg["seed"] == 5 and cfg["name"] == "quickstart"
    r = qmind("data", "ls", "--store", str(tmp_path / "empty"), cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith(f"no datasets in {tmp_path / 'empty'}")
    # the override reached the config
    r = qmind("data", "gen", "quickstart", "--workers", "1", "data.episodes=x", cwd=tmp_path)
    assert r.returncode == 2 and "bad value for 'data.episodes'" in r.stderr
    from qmind_render.data.splits import find_split
    import os

    here = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert (
            find_split("random_15").resolve()
            == (ROOT / "sweeps" / "splits" / "random_15.yaml").resolve()
        )
    finally:
        os.chdir(here)


def test_bench_takes_json_after_its_arguments():
    r = qmind("bench", "sampler", "size=tiny", "steps=[1]", "batches=[1]", "iters=1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["eager_b1_s1_ms"] > 0
