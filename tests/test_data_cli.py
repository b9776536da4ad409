"""`qmind data` as a user runs it: real subprocesses, a real SIGKILL mid-generation, S3 via
moto_server."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "data.dataset=ds-tiny",
    "data.episodes=6",
    "data.frames_per_episode=10",
    "data.shard_size=20",
]


def qmind(*args, cwd, env=None, **kw):
    exe = [sys.executable, "-c", "import sys; from qmind_render.cli import main; sys.exit(main())"]
    return subprocess.run(
        exe + list(args),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        **kw,
    )


@pytest.fixture
def work(tmp_path):
    "A working folder with the repository's splits, and a store inside it."
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "splits").symlink_to(ROOT / "sweeps" / "splits")
    return tmp_path


def test_gen_ls_verify_show(work):
    env = {"QMIND_STORE": str(work / "store"), "QMIND_CACHE": str(work / "cache")}
    r = qmind("data", "gen", *TINY, "--workers", "2", cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    assert "dataset ds-tiny: 60 samples in 3 shards" in r.stdout
    assert "sample/s" in r.stderr  # the progress bar reports throughput
    ls = qmind("data", "ls", cwd=work, env=env)
    assert ls.returncode == 0 and ls.stdout.startswith("ds-tiny") and "60 samples" in ls.stdout
    v = qmind("data", "verify", "ds-tiny", cwd=work, env=env)
    assert v.returncode == 0 and "OK" in v.stdout
    s = qmind(
        "data", "show", "ds-tiny", "--split", "random_15", "--out", "sheet.png", cwd=work, env=env
    )
    assert s.returncode == 0, s.stderr
    facts = json.loads(s.stdout[: s.stdout.rindex("}") + 1])
    kept = facts["split random_15"]
    assert facts["samples"] == 60 and sum(kept[k] for k in ("train", "heldout", "dropped")) == 60
    assert kept["validation"] + kept["test"] <= kept["heldout"]
    assert (work / "sheet.png").stat().st_size > 1000
    again = qmind("data", "gen", *TINY, cwd=work, env=env)
    assert (
        again.returncode == 2
        and "ds-tiny" in again.stderr
        and "immutable" in again.stderr
        and "qmind data repair ds-tiny" in again.stderr
    )


def test_verify_reports_a_flipped_byte(work):
    env = {"QMIND_STORE": str(work / "store")}
    assert qmind("data", "gen", *TINY, "--workers", "1", cwd=work, env=env).returncode == 0
    shard = work / "store" / "datasets" / "ds-tiny" / "shard-00002.npz"
    b = bytearray(shard.read_bytes())
    b[5000] ^= 0xFF
    shard.write_bytes(bytes(b))
    v = qmind("data", "verify", "ds-tiny", cwd=work, env=env)
    assert v.returncode == 1 and "dataset ds-tiny, shard shard-00002.npz" in v.stdout
    # the advice, followed, mends it byte for byte
    assert "`qmind data repair ds-tiny`" in v.stdout
    r = qmind("data", "repair", "ds-tiny", cwd=work, env=env)
    assert r.returncode == 0 and "shard-00002.npz: made again from the recipe" in r.stdout, r.stderr
    assert qmind("data", "verify", "ds-tiny", cwd=work, env=env).returncode == 0


def _manifest(store):
    return json.loads((store / "datasets" / "ds-kill" / "manifest.json").read_text())


def test_sigkill_mid_generation_leaves_no_dataset_and_a_rerun_finishes(work):
    args = [
        "data.dataset=ds-kill",
        "data.episodes=16",
        "data.frames_per_episode=25",
        "data.shard_size=25",
    ]
    killed, clean = work / "killed", work / "clean"
    exe = [sys.executable, "-c", "import sys; from qmind_render.cli import main; sys.exit(main())"]
    p = subprocess.Popen(
        exe + ["data", "gen", *args, "--workers", "1"],
        cwd=work,
        start_new_session=True,
        env={**os.environ, "QMIND_STORE": str(killed)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    shards = killed / "datasets" / "ds-kill"
    deadline = time.monotonic() + 120
    while len(list(shards.glob("shard-*.npz"))) < 4:
        assert p.poll() is None and time.monotonic() < deadline, (
            "generation ended before it could be killed"
        )
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    n_done = len(list(shards.glob("shard-*.npz")))
    assert 4 <= n_done < 16
    assert not (shards / "manifest.json").exists()
    # the half-made one is not listed
    assert qmind("data", "ls", "--store", str(killed), cwd=work).stdout.startswith(
        "no datasets in "
    )
    r = qmind("data", "gen", *args, cwd=work, env={"QMIND_STORE": str(killed)})
    assert r.returncode == 0, r.stderr
    assert qmind("data", "gen", *args, cwd=work, env={"QMIND_STORE": str(clean)}).returncode == 0
    a, b = _manifest(killed), _manifest(clean)
    # same seeds, same bytes: the resumed dataset equals an uninterrupted one
    assert a["shards"] == b["shards"]
    assert len(a["shards"]) == 16


def test_gen_to_s3_then_list_and_verify(work, s3_bucket):
    uri = f"s3://{s3_bucket}/team"
    env = {"QMIND_CACHE": str(work / "cache")}
    r = qmind("data", "gen", *TINY, f"data.store={uri}", "--workers", "1", cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    ls = qmind("data", "ls", "--store", uri, cwd=work, env=env)
    assert ls.stdout.startswith("ds-tiny")
    assert qmind("data", "verify", "ds-tiny", "--store", uri, cwd=work, env=env).returncode == 0


def test_split_files_are_versioned_not_overwritten(work, tmp_path):
    d = tmp_path / "elsewhere"
    d.mkdir()
    assert qmind("data", "split", "random_30", cwd=d).returncode == 0
    text = (d / "sweeps" / "splits" / "random_30.yaml").read_text()
    assert "\nvalidation:\n" in text and "\ntest:\n" in text and "held_out" not in text
    r = qmind("data", "split", "random_30", cwd=d)
    assert r.returncode == 2 and "--force" in r.stderr
    seeded = qmind("data", "split", "random_30", "--seed", "2", cwd=d)
    assert seeded.stdout.strip() == "sweeps/splits/random_30-s2.yaml", seeded.stderr
    assert "seed: 2\n" in (d / "sweeps" / "splits" / "random_30-s2.yaml").read_text()
    bad = qmind("data", "split", "half_and_half", cwd=d)
    assert bad.returncode == 2 and "random_K" in bad.stderr and "novelty{N}_P" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr


@pytest.mark.parametrize("workers", ["-3", "0"])
def test_a_process_count_below_one_is_refused_naming_the_option(work, capsys, monkeypatch, workers):
    from qmind_render.cli import main

    monkeypatch.setenv("QMIND_CACHE", str(work / "cache"))
    assert main(["data", "gen", *TINY, f"data.store={work / 'store'}", "--workers", workers]) == 2
    assert (
        capsys.readouterr().err
        == f"qmind data: error: --workers {workers}: must be at least 1 (leave it out for "
        "one process per core)\n"
    )
    assert not (work / "store").exists()
