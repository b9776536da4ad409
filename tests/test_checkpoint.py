"""The checkpoint module: names both ways, the model inside a checkpoint (a run's, one written
before the change, the shipped one), and the seal refusing a flipped bit. Training's use of it
(atomic writes, keep-last, resume) is tests/test_train.py's."""

from pathlib import Path

import pytest
import torch

from qmind_render.core.checkpoint import (
    CheckpointError,
    WeightsError,
    checkpoint_name,
    checkpoints,
    ema_weights,
    find_checkpoint,
    is_sealed_ok,
    load_checkpoint,
    load_model,
    load_shipped,
    reseal,
    run_dir_of,
    shipped_path,
    step_of,
    versions,
)
from qmind_render.core.config import config_to_dict, load_config
from qmind_render.core.diffusion import ddim_sample
from qmind_render.core.encodings import prepare_batch, synthetic_batch
from qmind_render.core.model import build_model
from qmind_render.core.optim import make_ema
from qmind_render.world.grid import load_grid

GOLDEN = Path(__file__).parent / "golden" / "compat" / "runs" / "compat"


def test_names_both_ways():
    assert [step_of(checkpoint_name(n)) for n in (0, 20, 4500, 9_999_999)] == [
        0,
        20,
        4500,
        9_999_999,
    ]
    assert step_of(Path("runs/a/checkpoints/0000300.pt")) == 300 and run_dir_of(
        "runs/a/checkpoints/0000300.pt"
    ) == Path("runs/a")
    for bad in ("0000020.pt.corrupt", ".0000020.pt.tmp", "000020.pt", "latest.pt", "٠٠٠٠٠٢٠.pt"):
        with pytest.raises(CheckpointError, match="not a checkpoint name"):
            step_of(bad)


def test_load_model_gives_the_ema_weights_and_the_configs_diffusion():
    cfg = load_config(
        None,
        [
            "model.regression=false",
            "model.size=tiny",
            "model.prediction=v",
            "model.schedule=linear",
        ],
    )
    torch.manual_seed(0)
    net = build_model(cfg.model, grid=load_grid())
    ema = make_ema(net, 0.5)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.01)
    ema.update_parameters(net)
    ck = {"ema": ema.state_dict(), "config": config_to_dict(cfg), "versions": versions()}
    assert "n_averaged" in ck["ema"] and "n_averaged" not in ema_weights(ck)
    model, diffusion = load_model(ck)
    assert not model.training and (diffusion.prediction, diffusion.schedule) == ("v", "linear")
    mine = model.state_dict()
    assert all(torch.equal(mine[k], v) for k, v in ema.module.state_dict().items())
    with pytest.raises(CheckpointError, match="9.0.0"):
        load_model(
            {**ck, "versions": {**ck["versions"], "channel_spec": "9.0.0"}}, what="checkpoint x.pt"
        )


def test_a_checkpoint_from_before_the_change_renders():
    path = find_checkpoint(GOLDEN)
    assert path == checkpoints(GOLDEN)[-1] and step_of(path) == 2
    model, diffusion = load_model(load_checkpoint(path), what=f"checkpoint {path}")
    _, cond = prepare_batch(synthetic_batch(2))
    x = ddim_sample(model, cond, diffusion, 4, torch.Generator().manual_seed(0)).double()
    assert x.shape == (2, 3, 64, 64) and torch.isfinite(x).all()
    # a checksum that sees where each value is
    w = torch.linspace(-1, 1, x.numel(), dtype=torch.float64).view_as(x)
    got = [x.mean().item(), x.abs().mean().item(), (x * w).sum().item()]
    assert got == pytest.approx(COMPAT_SAMPLE, rel=1e-5, abs=1e-7), got


# 4 DDIM steps from the compat checkpoint on synthetic_batch(2), seed 0: mean, mean |x|, sum of x *
# linspace(-1, 1), computed by the code at 06038d7 (before issue 20's clean-up), which must not
# change what a checkpoint renders.
COMPAT_SAMPLE = [-0.021706153377825405, 0.5254189652687652, 49.51715352556219]


def test_the_shipped_model_is_sealed_and_a_flipped_bit_is_refused(tmp_path):
    blob = torch.load(shipped_path(), weights_only=True)
    assert "sha256" in blob and is_sealed_ok(blob)
    w = next(v for v in blob["ema"].values() if v.numel() >= 64)
    b = bytearray(shipped_path().read_bytes())
    i = b.find(w.contiguous().view(-1).view(torch.uint8).numpy().tobytes()[:64])
    b[i + 9] ^= 0x02
    (bad := tmp_path / "shipped.pt").write_bytes(bytes(b))
    with pytest.raises(
        ValueError, match="shipped.pt is corrupt: its content does not match the hash"
    ):
        load_shipped(bad)


def test_a_file_without_a_seal_loads_with_one_warning_line_and_a_damaged_seal_is_refused(
    tmp_path, capsys
):
    """Written before seals existed (here: the golden checkpoint and the shipped model, their seals
    taken off): each loads, saying once that it can't be verified."""
    ck = torch.load(find_checkpoint(GOLDEN), weights_only=True)
    del ck["sha256"]
    old = tmp_path / "checkpoints" / "0000002.pt"
    old.parent.mkdir()
    torch.save(ck, old)
    load_model(load_checkpoint(old), what=f"checkpoint {old}")
    assert capsys.readouterr().err.splitlines() == [
        f"qmind: warning: {old} has no seal (written before checkpoints were sealed), so "
        "its content can't be verified; once you "
        f"trust it: python -c \"from qmind_render.core.checkpoint import reseal; reseal('{old}')\""
    ]
    reseal(old)
    assert (
        is_sealed_ok(torch.load(old, weights_only=True))
        and load_checkpoint(old)["step"] == 2
        and capsys.readouterr().err == ""
    )
    torch.save({**ck, "sha256": 1234}, old)
    with pytest.raises(
        CheckpointError,
        match=r"0000002.pt has a malformed seal \(sha256 is '1234', not 64 hex digits\)",
    ):
        load_checkpoint(old)
    blob = torch.load(shipped_path(), weights_only=True)
    torch.save({k: v for k, v in blob.items() if k != "sha256"}, tmp_path / "unsealed.pt")
    load_shipped(tmp_path / "unsealed.pt")
    assert capsys.readouterr().err.count("unsealed.pt has no seal") == 1
    torch.save({**blob, "sha256": "not a hash"}, tmp_path / "damaged.pt")
    with pytest.raises(
        WeightsError, match="damaged.pt has a malformed seal.*reinstall the package"
    ):
        load_shipped(tmp_path / "damaged.pt")
