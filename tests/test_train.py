"""Training as users run it: real subprocesses killed with SIGKILL at several points and resumed,
torchrun with 2 gloo processes, checkpoints moving between 1 and 2 processes, and every fault
the issue names.

A process is started only where the check needs one (a signal, torchrun); a refusal's one line and
exit status are `qmind_render.cli.main`'s, called here, and a resume after a kill runs here, on one
thread as the subprocesses do (each process costs seconds of imports)."""

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from qmind_render.data.cache import fetch
from qmind_render.core.config import load_config
from qmind_render.core.device import resolve_precision
from qmind_render.data.stores import open_store
from qmind_render.data.generate import generate
from qmind_render.core.checkpoint import (
    CheckpointError,
    checkpoints,
    load_checkpoint,
    save_checkpoint,
    seal,
)
from qmind_render.core.checkpoint import pick_resume
from qmind_render.core.tracking import read_metrics
from qmind_render.core.train import NonFiniteError, resume, save, setup, train

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "import sys; from qmind_render.cli import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    "A small dataset in a local store, made once for this module."
    tmp = tmp_path_factory.mktemp("train")
    os.environ["QMIND_CACHE"] = str(tmp / "cache")
    cfg = load_config(
        None,
        [
            f"data.store={tmp}/store",
            "data.dataset=ds-t",
            "data.episodes=8",
            "data.frames_per_episode=16",
        ],
    )
    generate(cfg.data, workers=2, progress=False)
    return tmp


def args(data, name, steps=12, *extra):
    return [
        f"data.store={data}/store",
        "data.dataset=ds-t",
        f"name={name}",
        "train.batch=4",
        f"train.steps={steps}",
        "train.warmup=2",
        "train.log_every=1",
        "train.sample_every=0",
        "tracker=none",
        "train.lr=1e-3",
        "train.ckpt_every_steps=2",
        # the one-step fine-tune in the last 2 steps: a run of 12 has both phases (the main job's
        # 700 would make every step of these runs one)
        "train.finetune_steps=2",
        *extra,
    ]


def env(data):
    return {
        **os.environ,
        "QMIND_CACHE": str(data / "cache"),
        "QMIND_RUNS": str(data / "runs"),
        "OMP_NUM_THREADS": "1",
    }


def weights(run_dir):
    return load_checkpoint(checkpoints(run_dir)[-1])


@contextlib.contextmanager
def one_thread():
    "Train here on one intra-op thread, as the subprocesses do (OMP_NUM_THREADS=1): the same bits."
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def same_weights(a, b):
    return (
        all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
        and all(torch.equal(a["ema"][k], b["ema"][k]) for k in a["ema"])
        and a["step"] == b["step"]
    )


@pytest.fixture(scope="module")
def straight(data):
    "The uninterrupted run everything is compared with (same thread count as the subprocesses)."
    with one_thread():
        res = train(load_config(None, args(data, "straight")), data / "runs", progress=False)
    assert res["status"] == "finished" and res["step"] == 12, res
    return weights(data / "runs" / "straight")


@pytest.mark.parametrize("kill_after", [3, 7])
def test_sigkill_and_resume_is_bit_identical(data, straight, kill_after):
    name = f"killed{kill_after}"
    p = subprocess.Popen(
        CLI + ["train", *args(data, name)],
        env=env(data),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run_dir, deadline = data / "runs" / name, time.monotonic() + 240
    while not read_metrics(run_dir) or read_metrics(run_dir)[-1]["step"] < kill_after:
        assert p.poll() is None and time.monotonic() < deadline, (
            "the run ended before it could be killed"
        )
        time.sleep(0.02)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    killed_at = read_metrics(run_dir)[-1]["step"]
    assert killed_at < 12 and checkpoints(run_dir)[-1].stem != "0000012"
    with one_thread():
        res = train(load_config(None, args(data, name)), data / "runs", progress=False)
    assert res["status"] == "finished" and 0 < res["steps_this_call"] < 12, res
    assert same_weights(weights(run_dir), straight)
    # the resumed loss curve is the uninterrupted one, with no duplicated steps
    m, s = read_metrics(run_dir), read_metrics(data / "runs" / "straight")
    assert [x["step"] for x in m] == list(range(1, 13)) and [x["loss"] for x in m] == [
        x["loss"] for x in s
    ]


def test_sigterm_checkpoints_and_exits(data):
    p = subprocess.Popen(
        CLI + ["train", *args(data, "termed", 40, "train.ckpt_every_steps=0")],
        env=env(data),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_dir, deadline = data / "runs" / "termed", time.monotonic() + 240
    while not read_metrics(run_dir) or read_metrics(run_dir)[-1]["step"] < 2:
        assert p.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, err
    res = json.loads(out)
    assert res["status"] == "stopped by SIGTERM" and res["step"] < 40
    assert checkpoints(run_dir)[-1].stem == f"{res['step']:07d}"


def torchrun(data, *a, n=2):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={n}",
        "-m",
        "qmind_render.core.train",
        *a,
    ]
    return subprocess.run(cmd, env=env(data), capture_output=True, text=True, timeout=400, cwd=ROOT)


def test_ddp_two_processes_and_checkpoints_cross_world_sizes(data):
    r = torchrun(data, *args(data, "ddp", 4))
    assert r.returncode == 0, r.stderr[-3000:]
    ck = weights(data / "runs" / "ddp")
    assert ck["world"] == 2 and ck["step"] == 4
    # written by rank 0 of 2, resumed by one process
    res = train(load_config(None, args(data, "ddp", 6)), data / "runs", progress=False)
    assert res["steps_this_call"] == 2, res
    assert (
        weights(data / "runs" / "ddp")["world"] == 1 and weights(data / "runs" / "ddp")["step"] == 6
    )
    # and back: one process's checkpoint resumed by two
    r2 = torchrun(data, *args(data, "ddp", 8))
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert weights(data / "runs" / "ddp")["step"] == 8


def test_missing_dataset_and_split_are_clear(data, monkeypatch):
    monkeypatch.chdir(data)
    with pytest.raises(Exception, match=r"dataset ds-nope.*not in store.*qmind data gen"):
        train(load_config(None, args(data, "x") + ["data.dataset=ds-nope"]), data / "runs")
    with pytest.raises(FileNotFoundError, match="random_99.*qmind data split random_99"):
        train(load_config(None, args(data, "x") + ["data.holdout=random_99"]), data / "runs")


def test_split_for_another_grid_is_refused(data, tmp_path):
    bad = tmp_path / "other.yaml"
    bad.write_text(
        "name: other\nversion: 1\nseed: 0\ngrid: {theme: 4, material: 5, light: "
        "4}\nheld_out: [[0, 0, 0]]\n"
    )
    with pytest.raises(ValueError, match="split other is for grid"):
        train(load_config(None, args(data, "x2") + [f"data.holdout={bad}"]), data / "runs")


@pytest.mark.parametrize("log_every", [1, 100])
def test_nonfinite_loss_stops_naming_step_and_checkpoint(data, monkeypatch, log_every):
    """Found at the next log line or before the next checkpoint, whichever comes first: never a
    checkpoint after it."""
    import qmind_render.core.train as T

    real = T.diffusion_loss
    calls = {"n": 0}

    def poisoned(*a, **k):
        calls["n"] += 1
        loss = real(*a, **k)
        return loss * float("nan") if calls["n"] == 5 else loss

    monkeypatch.setattr(T, "diffusion_loss", poisoned)
    with pytest.raises(
        NonFiniteError, match=r"step 4 .*loss=nan.*last good checkpoint: .*0000004.pt"
    ):
        train(
            load_config(None, args(data, f"nan{log_every}", 12, f"train.log_every={log_every}")),
            data / "runs",
        )
    # nothing written after the bad step
    assert checkpoints(data / "runs" / f"nan{log_every}")[-1].stem == "0000004"
    if log_every > 1:
        return
    calls["n"] = 0
    res = train(load_config(None, args(data, "nan-skip", 6, "train.nonfinite=skip")), data / "runs")
    assert (
        res["status"] == "finished"
        and sum(m["skipped"] for m in read_metrics(data / "runs" / "nan-skip")) == 1
    )


def test_a_training_step_reads_nothing_back_from_the_device(data):
    """No .item()/bool()/float() of a tensor in a step (each is a host sync on a GPU): the guard,
    meter and EMA stay on the device."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from qmind_render.core.train import Meter, batches, loop_step, setup

    class Reads(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                Reads.n += 1
            return func(*args, **(kwargs or {}))

    run = setup(load_config(None, args(data, "nosync", 6)), data / "runs")
    it, meter = batches(run), Meter()
    loop_step(run, it, meter)
    with Reads():
        for _ in range(3):
            loop_step(run, it, meter)
    assert Reads.n == 0 and run.step == 4
    assert meter.read(run)["skipped"] == 0 and torch.isfinite(torch.tensor(meter.read(run)["loss"]))


def test_out_of_memory_names_the_settings_and_keeps_the_checkpoint(data, monkeypatch):
    import qmind_render.core.train as T

    real, calls = T.train_step, {"n": 0}

    def oom(run, micro):
        calls["n"] += 1
        if calls["n"] == 5:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(run, micro)

    monkeypatch.setattr(T, "train_step", oom)
    with pytest.raises(
        T.OutOfMemory,
        match=r"out of memory at step 4 with train.batch=4 on cpu: try train.batch=2 "
        r"train.grad_accum=2 .*last checkpoint, .*0000004.pt, is intact",
    ):
        train(load_config(None, args(data, "oom")), data / "runs")
    last = checkpoints(data / "runs" / "oom")[-1]
    assert last.stem == "0000004" and load_checkpoint(last)["step"] == 4


@pytest.mark.parametrize("device, kind", [("mps", torch.mps), ("cuda:3", torch.cuda)])
def test_every_device_the_config_takes_is_checked_in_one_line(
    data, capsys, device, kind, monkeypatch
):
    """train.device=mps and cuda:N as much as cuda: the machine is asked, and the answer is one line
    naming the key, before anything runs."""
    from qmind_render.cli import main

    if kind.is_available() and kind.device_count() > 3:
        pytest.skip(f"this machine has {device}")
    monkeypatch.setenv("QMIND_RUNS", str(data / "runs"))
    assert main(["train", *args(data, f"dev-{device[:3]}", 2, f"train.device={device}")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"qmind train: error: train.device={device}, but this machine has "
    ), err
    assert not (data / "runs" / f"dev-{device[:3]}").exists()


def test_a_runs_folder_that_cant_be_made_names_the_option(data, capsys):
    from qmind_render.cli import main

    assert main(["train", *args(data, "r", 2), "--runs", "/proc/nope"]) == 2
    err = capsys.readouterr().err
    assert (
        err == "qmind train: error: --runs /proc/nope: can't make it (No such file or "
        "directory); pick a folder you can write with --runs DIR\n"
    )


def test_a_resume_onto_other_dataset_content_is_refused(data):
    """The same dataset name made again with other content in another store: the checkpoint's
    dataset_sha256 says it is not what it trained on."""
    train(load_config(None, args(data, "content", 2)), data / "runs", progress=False)
    other = load_config(
        None,
        [
            f"data.store={data}/other-store",
            "data.dataset=ds-t",
            "data.episodes=4",
            "data.frames_per_episode=8",
        ],
    )
    generate(other.data, workers=1, progress=False)
    ck = checkpoints(data / "runs" / "content")[-1]
    made = load_checkpoint(ck)["dataset_sha256"][:12]
    now = fetch(open_store(other.data.store), "ds-t").manifest.content_id
    with pytest.raises(
        CheckpointError,
        match=rf"0000002.pt was trained on dataset ds-t with content id {made}, but ds-t in "
        rf"{data}/other-store has content id {now}: another dataset.*new run name",
    ):
        train(
            load_config(None, args(data, "content", 4, f"data.store={data}/other-store")),
            data / "runs",
            progress=False,
        )
    assert [p.name for p in checkpoints(data / "runs" / "content")] == ["0000002.pt"]


def test_a_malformed_split_file_is_one_line_and_writes_nothing(data, tmp_path, capsys):
    from qmind_render.cli import main

    cases = [
        ("hostname", "vm\n", "it holds str 'vm', not a mapping"),
        (
            "syntax.yaml",
            "name: x\n  grid: [\n",
            "not valid YAML at line 2, column 7: mapping values are not allowed here",
        ),
        (
            "cells.yaml",
            'name: x\ngrid: {theme: 5, material: 5, light: 4}\nheld_out: "abc"\n',
            "held_out: 'abc' is not of type 'array'",
        ),
    ]
    for i, (name, text, said) in enumerate(cases):
        (tmp_path / name).write_text(text)
        assert (
            main(
                [
                    "train",
                    *args(data, f"split{i}", 2, f"data.holdout={tmp_path / name}"),
                    "--runs",
                    str(data / "runs"),
                ]
            )
            == 2
        )
        err = capsys.readouterr().err
        assert (
            err.count("\n") == 1 and f"split file {tmp_path / name} is not a split: {said}" in err
        ), err
        assert not (data / "runs" / f"split{i}").exists()


def test_a_device_the_machine_lacks_is_one_line(data, capsys, monkeypatch):
    from qmind_render.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setenv("QMIND_RUNS", str(data / "runs"))
    assert main(["train", *args(data, "nocuda", 2, "train.device=cuda")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert (
        "train.device=cuda, but this machine has no CUDA device" in err
        and "train.device=auto" in err
    )
    # refused before anything was written
    assert not (data / "runs" / "nocuda").exists()


def test_progress_is_a_line_per_log_step_off_a_terminal_and_a_bar_on_one(data, capsys):
    import io

    from qmind_render.core.tracking import Progress

    train(
        load_config(
            None, args(data, "progress", 6, "train.log_every=2", "train.ckpt_every_steps=0")
        ),
        data / "runs",
    )
    lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("  step ")]
    assert [l.split()[1] for l in lines] == ["2/6", "4/6", "6/6"] and all(
        " samples/s " in l and l.endswith(" left") for l in lines
    )

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    p = Progress(10, 0, "demo", out)
    for _ in range(4):
        p.update()
    p.log(4, {"loss": 0.0312, "samples_per_s": 812.0, "step_ms": 39.4})
    p.update()
    p.close()
    assert (
        "training demo" in out.getvalue()
        and "5/10" in out.getvalue()
        and "loss 0.0312, 812 samples/s" in out.getvalue()
    )


def test_full_disk_keeps_previous_checkpoint(data, monkeypatch):
    res = train(load_config(None, args(data, "disk", 2)), data / "runs")
    good = Path(res["last_checkpoint"])
    before = good.read_bytes()

    def full(obj, f, *a, **k):
        Path(f).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    state = load_checkpoint(good)
    state["step"] = 3
    with pytest.raises(
        CheckpointError, match=r"0000003.pt \(the disk is full\).*previous checkpoint is untouched"
    ):
        save_checkpoint(state, data / "runs" / "disk", keep_last=3)
    assert [p.name for p in checkpoints(data / "runs" / "disk")] == [
        good.name
    ] and good.read_bytes() == before
    assert not list((data / "runs" / "disk" / "checkpoints").glob(".*tmp"))


def test_nonfinite_weights_are_never_checkpointed(data):
    res = train(load_config(None, args(data, "inf", 2)), data / "runs")
    state = load_checkpoint(Path(res["last_checkpoint"]))
    k = next(iter(state["model"]))
    state["model"][k] = state["model"][k] * float("inf")
    state["step"] = 99
    with pytest.raises(CheckpointError, match="non-finite weights"):
        save_checkpoint(state, data / "runs" / "inf", keep_last=3)


def test_incompatible_checkpoint_and_corrupt_file(data, capsys, monkeypatch):
    from qmind_render.cli import main

    train(load_config(None, args(data, "compat", 2)), data / "runs", progress=False)
    with pytest.raises(CheckpointError, match=r"made with model=.*start a new run name"):
        train(load_config(None, args(data, "compat", 4, "model.theme_enc=id")), data / "runs")
    before = (data / "runs" / "compat" / "config.yaml").read_text()
    monkeypatch.setenv("QMIND_RUNS", str(data / "runs"))
    capsys.readouterr()
    assert main(["train", *args(data, "compat", 4, "train.lr=2e-3")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert (
        err.startswith("qmind train: error: ")
        and "0000002.pt was made with train.lr=0.001, this run has 0.002" in err
    )
    # the refused config was not written
    assert (data / "runs" / "compat" / "config.yaml").read_text() == before
    ck = checkpoints(data / "runs" / "compat")[-1]
    state = torch.load(ck, weights_only=True)
    state["versions"]["channel_spec"] = "0.2.0"
    # resealed: an edit that knows the format
    torch.save(seal(state), ck)
    with pytest.raises(CheckpointError, match=r"0\.2\.0.*0\.1\.1"):
        train(load_config(None, args(data, "compat", 4)), data / "runs")
    ck.write_bytes(b"garbage")
    with pytest.raises(
        CheckpointError,
        match="no readable checkpoint in .*0000002.pt is not a readable checkpoint .corrupt, "
        "truncated",
    ):
        train(load_config(None, args(data, "compat", 4)), data / "runs")


def test_keep_last_and_weights_only(data):
    train(load_config(None, args(data, "keep", 8, "train.keep_last=2")), data / "runs")
    assert [p.stem for p in checkpoints(data / "runs" / "keep")] == ["0000006", "0000008"]
    ck = torch.load(checkpoints(data / "runs" / "keep")[-1], weights_only=True)
    assert (
        ck["config"]["name"] == "keep"
        and ck["dataset"] == "ds-t"
        and len(ck["dataset_sha256"]) == 64
        and ck["versions"]["channel_spec"] == "0.1.1"
    )
    assert {"model", "ema", "optimizer", "scheduler", "rng", "step", "epoch", "pos", "git"} <= set(
        ck
    )


def test_wandb_offline_tracking(data, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    res = train(
        load_config(None, args(data, "wb", 2, "tracker=wandb", "train.sample_every=2")),
        data / "runs",
    )
    run_dir = Path(res["run_dir"])
    assert list((run_dir / "wandb").glob("offline-run-*")), "wandb wrote no offline run"
    assert (run_dir / "samples" / "0000002.png").is_file()
    m = read_metrics(run_dir)
    assert {"loss", "lr", "grad_norm", "samples_per_s", "data_wait"} <= set(m[-1])


def test_a_wandb_mode_wandb_would_reject_is_one_line(data, capsys, monkeypatch):
    """An empty or misspelt WANDB_MODE: one line naming the variable and the fix, exit 2 (wandb's
    own refusal names neither)."""
    from qmind_render.cli import main

    monkeypatch.setenv("QMIND_RUNS", str(data / "runs"))
    monkeypatch.setenv("WANDB_MODE", "")
    assert main(["train", *args(data, "wb-empty", 2, "tracker=wandb")]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and err.startswith("qmind train: error: WANDB_MODE='' is not a wandb mode")
        and "WANDB_MODE=offline" in err
    ), err


def _flip_a_weight(path):
    "Flip one bit inside a weight tensor's bytes: torch.load still reads the file."
    ck = torch.load(path, weights_only=True)
    w = next(v for v in ck["model"].values() if v.numel() >= 64)
    b = bytearray(path.read_bytes())
    i = b.find(w.contiguous().view(-1).numpy().tobytes()[:64])
    assert i > 0
    b[i + 17] ^= 0x04
    path.write_bytes(bytes(b))
    torch.load(path, weights_only=True)


def test_auto_precision_is_pinned_when_a_run_starts_and_kept_when_it_resumes(data):
    """train.precision=auto: this device's choice is what config.yaml and the checkpoints record; a
    resumed run keeps the one it started in."""

    def recorded(name):
        on_disk = load_config(data / "runs" / name / "config.yaml").train.precision.value
        assert weights(data / "runs" / name)["config"]["train"]["precision"] == on_disk
        return on_disk

    here = resolve_precision("auto").value
    other = {"fp32": "bf16", "bf16": "fp32"}[here]
    train(
        load_config(None, args(data, "auto", 2, "train.precision=auto")),
        data / "runs",
        progress=False,
    )
    assert recorded("auto") == here
    train(
        load_config(None, args(data, "started-other", 2, f"train.precision={other}")),
        data / "runs",
        progress=False,
    )
    res = train(
        load_config(None, args(data, "started-other", 4, "train.precision=auto")),
        data / "runs",
        progress=False,
    )
    # resumed, not refused
    assert res["step"] == 4 and res["steps_this_call"] == 2 and recorded("started-other") == other
    # asked for explicitly: refused
    with pytest.raises(CheckpointError, match=f"train.precision='{other}', this run has '{here}'"):
        train(
            load_config(None, args(data, "started-other", 6, f"train.precision={here}")),
            data / "runs",
            progress=False,
        )


def test_a_flipped_bit_is_refused_in_one_line_and_latest_falls_back(data, capsys, monkeypatch):
    """The seal catches what torch.load does not; an explicit resume refuses it (exit 2, one line);
    latest resumes the newest good one, saying so."""
    from qmind_render.cli import main

    train(load_config(None, args(data, "flip", 4)), data / "runs", progress=False)
    run = data / "runs" / "flip"
    _flip_a_weight(run / "checkpoints" / "0000004.pt")
    monkeypatch.setenv("QMIND_RUNS", str(data / "runs"))
    capsys.readouterr()
    assert main(["train", *args(data, "flip", 6, "train.resume=0000004.pt")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert err.startswith("qmind train: error: ") and len(err.strip().splitlines()) == 1, err
    assert "0000004.pt is corrupt: its content does not match the hash" in err
    # training's own advice
    assert "other checkpoints: 0000002.pt (resume from it with train.resume=0000002.pt)" in err
    res = train(load_config(None, args(data, "flip", 6)), data / "runs", progress=False)
    said = [l for l in capsys.readouterr().err.splitlines() if "set it aside" in l]
    assert said == [
        f"qmind train: {run / 'checkpoints' / '0000004.pt'} is corrupt: its content does "
        "not match the hash it was written "
        "with (a flipped bit or an edit); set it aside as 0000004.pt.corrupt and resumed "
        "from 0000002.pt instead"
    ], said
    assert res["step"] == 6 and (run / "checkpoints" / "0000004.pt.corrupt").is_file()
    assert [p.name for p in checkpoints(run)] == ["0000002.pt", "0000004.pt", "0000006.pt"]


def test_python_and_numpy_random_states_are_restored(data):
    import random

    import numpy as np

    run = setup(load_config(None, args(data, "rng", 2, "train.ckpt_every_steps=0")), data / "runs")
    random.seed(11)
    np.random.seed(12)
    random.random()
    np.random.rand()
    random.gauss(0, 1)
    np.random.randn()
    save(run)
    want = random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), np.random.randn()
    random.seed(99)
    np.random.seed(99)
    again = setup(
        load_config(None, args(data, "rng", 2, "train.ckpt_every_steps=0")), data / "runs"
    )
    resume(again, pick_resume(again.dir, "latest"))
    assert again.last_ckpt is not None
    assert (
        random.random(),
        random.gauss(0, 1),
        np.random.rand(3).tolist(),
        np.random.randn(),
    ) == want


def test_bad_values_and_escaping_names_are_refused_before_anything_runs(data, capsys, monkeypatch):
    from qmind_render.cli import main

    monkeypatch.setenv("QMIND_RUNS", str(data / "runs"))
    for bad, said in [
        ("train.steps=-5", "'train.steps': -5 must be at least 1"),
        ("name=../escaped", "must be one folder name"),
    ]:
        assert main(["run", *args(data, "x", 2), bad]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err
    assert not (data / "escaped").exists() and not (data / "runs" / "x").exists()
