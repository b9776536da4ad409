"""The fast sampler (nbs/core/43_sampler.ipynb); evaluation and serving through it are tested in
their own files.

On every machine: the sampler's fixed-buffer path (what a GPU captures and replays; on a CPU the
loop is re-run in its place) equals the reference `ddim_sample` in float32 (to the bit when the
batch fills its bucket; padded, to rounding), for every encoding, batch bucket and step count, and
with EDM's preconditioning. With CUDA (skipped without): the captured graph equals the eager loop
within bf16 tolerance, replays are deterministic, the graph of the compiled network agrees too, and
a training step never makes the host wait for the device."""

import pytest
import torch

from qmind_render.core.config import ThemeEnc, load_config
from qmind_render.core.diffusion import Diffusion, ddim_sample
from qmind_render.core.encodings import ENCODINGS, prepare_batch, synthetic_batch
from qmind_render.core.model import build_model
from qmind_render.core.sampler import GraphSampler, SamplerError
from qmind_render.world.grid import load_grid

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def model_and_diffusion(size="tiny", device="cpu", *extra):
    cfg = load_config(None, [f"model.size={size}", *extra])
    torch.manual_seed(0)
    model = build_model(cfg.model, grid=load_grid())
    # untrained, but not a constant frame
    with torch.no_grad():
        torch.nn.init.normal_(model.net.out[-1].weight, std=0.05)
    return model.to(device).eval(), Diffusion.from_config(cfg.model)


def inputs(n, device="cpu", seed=0):
    _, cond = prepare_batch(synthetic_batch(n, seed=seed), device)
    return cond, torch.randn(n, 3, 64, 64, generator=torch.Generator().manual_seed(seed)).to(device)


@pytest.mark.parametrize(
    "enc,pred", [(e.value, "v") for e in ENCODINGS[ThemeEnc]] + [("planes", "edm")]
)
def test_fixed_buffers_equal_the_reference_on_cpu(enc, pred):
    "edm: the network's input is scaled by c_in on both paths (a path that forgot it would differ)."
    model, d = model_and_diffusion(
        "tiny",
        "cpu",
        f"model.theme_enc={enc}",
        "model.material_enc=embedding",
        f"model.prediction={pred}",
    )
    s = GraphSampler(model, d, dtype=torch.float32, buckets=(1, 4, 8), graphs=True)
    for n, steps in [(1, 1), (3, 3), (5, 2), (3, 1)]:
        cond, x = inputs(n, seed=n + steps)
        a, ref = s(cond, x, steps), ddim_sample(model, cond, d, steps, x_T=x)
        # the same batch: the same kernels, bit for bit
        if n in s.buckets:
            assert torch.equal(a, ref), (n, steps)
        # padded: another batch size, rounding only
        else:
            assert (a - ref).abs().max() < 1e-5, (n, steps)
    assert sorted(s.captured) == [(1, 1), (4, 1), (4, 3), (8, 2)]
    with pytest.raises(SamplerError, match="a batch of 9 is more than .* largest batch bucket, 8"):
        s(*inputs(9), 1)


def test_the_lit_head_is_in_every_samplers_network():
    "A sampler that called the U-Net alone (as it once did) would drop the lighting's gain."
    model, d = model_and_diffusion("tiny", "cpu", "model.theme_enc=planes", "model.lit_head=16")
    with torch.no_grad():
        torch.nn.init.normal_(model.lit[-1].weight, std=0.2)
    cond, x = inputs(4, seed=1)
    ref = ddim_sample(model, cond, d, 2, x_T=x)
    assert torch.equal(GraphSampler(model, d, dtype=torch.float32, buckets=(4,))(cond, x, 2), ref)
    bf16 = GraphSampler(model, d, dtype=torch.bfloat16, buckets=(4,))(cond, x, 2)
    assert (bf16 - ref).abs().mean() < 0.02
    with torch.no_grad():
        model.lit[-1].weight.zero_()
    assert (ddim_sample(model, cond, d, 2, x_T=x) - ref).abs().mean() > 0.05


@needs_cuda
@pytest.mark.parametrize("size", ["small", "base"])
def test_cuda_graph_equals_the_eager_loop(size):
    model, d = model_and_diffusion(size, "cuda")
    graph, eager = GraphSampler(model, d, graphs=True), GraphSampler(model, d, graphs=False)
    assert graph.net.dtype == torch.bfloat16
    for n, steps in [(1, 1), (1, 4), (3, 2), (8, 4)]:
        cond, x = inputs(n, "cuda", seed=n + steps)
        a, b = graph(cond, x, steps), eager(cond, x, steps)
        assert (a - b).abs().max() < 2e-2, (n, steps, float((a - b).abs().max()))
        # a replay is deterministic
        assert torch.equal(a, graph(cond, x, steps))
        ref = ddim_sample(model, cond, d, steps, x_T=x, autocast=torch.bfloat16)
        assert (a - ref).abs().max() < 0.1
    cond, x = inputs(3, "cuda", seed=99)
    # the buffers are refilled each call
    assert not torch.equal(graph(cond, x, 2), graph(*inputs(3, "cuda", seed=98), 2))


@needs_cuda
def test_cuda_graph_of_the_compiled_network():
    model, d = model_and_diffusion("small", "cuda")
    compiled, eager = (
        GraphSampler(model, d, buckets=(1, 8), compile=True),
        GraphSampler(model, d, graphs=False, buckets=(1, 8)),
    )
    for n in (1, 8):
        cond, x = inputs(n, "cuda", seed=n)
        assert (compiled(cond, x, 4) - eager(cond, x, 4)).abs().max() < 3e-2


@needs_cuda
def test_cuda_training_step_never_makes_the_host_wait(tmp_path):
    import os

    from qmind_render.data.generate import generate
    from qmind_render.core.train import Meter, batches, loop_step, setup

    os.environ.setdefault("QMIND_CACHE", str(tmp_path / "cache"))
    o = [
        f"data.store={tmp_path}/store",
        "data.dataset=ds-sync",
        "data.episodes=8",
        "data.frames_per_episode=16",
        "train.batch=8",
        "train.steps=20",
        "train.device=cuda",
        "train.compile=false",
        "tracker=none",
        "name=sync",
        "train.precision=bf16",
    ]
    generate(load_config(None, o).data, workers=2, progress=False)
    run = setup(load_config(None, o), tmp_path / "runs")
    it, meter = batches(run), Meter()
    # lazy initialisation happens here
    for _ in range(2):
        loop_step(run, it, meter)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            loop_step(run, it, meter)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert meter.read(run)["skipped"] == 0
