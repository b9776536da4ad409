"""The network and its process (nbs/39_encodings, 40_model, 41_diffusion): sizes and parameter
counts, encoders (one-hot exactness, uv wrap, palette planes, the channel count following the
choices), the schedule and DDIM update checked number for number against diffusers, DDIM exactness
with an oracle for any step count, determinism from a generator, the deck's overfit-one-batch test,
and bad inputs named. Where a comparison could pass vacuously, a paired check shows it fails on a
wrong input.

diffusers is a dev-only dependency (`pip install diffusers`: it does not pull torch); its tests are
skipped without it."""

import itertools
import os

import pytest
import torch
import torch.nn as nn

from qmind_render.contracts import load_spec
from qmind_render.core.config import MaterialEnc, Schedule, ThemeEnc
from qmind_render.core.diffusion import Diffusion, ddim_sample, diffusion_loss
from qmind_render.core.encodings import (
    ENCODINGS,
    ConditionEncoder,
    Encoded,
    ModelInputError,
    condition_tables,
    model_config,
    prepare_batch,
    synthetic_batch,
)
from qmind_render.core.model import SIZES, ConditionalUNet, UNetSize, build_model, n_params
from qmind_render.core.flops import forward_flops
from qmind_render.core.optim import make_ema
from qmind_render.core.model_bench import bench_cpu, bench_throughput
from qmind_render.core.train import overfit_one_batch
from qmind_render.world.grid import load_grid

SPEC, GRID = load_spec(), load_grid()
TABLES = condition_tables(GRID, SPEC)
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 2)))


def cfg(**kw):
    """The default `ModelConfig` as a diffusion model (the main job's is the regression control),
    with `kw` changed (a real config, as training builds from)."""
    return model_config(**({"regression": False} | kw))


@pytest.fixture(scope="module")
def batch():
    return synthetic_batch(4, seed=1)


def randomise(model: nn.Module, seed: int = 0) -> nn.Module:
    "Give zero-initialised layers small random weights, so every input can reach the output."
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.abs().max() == 0:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    "size,lo,hi", [("tiny", 0.1e6, 0.6e6), ("small", 1e6, 3e6), ("base", 25e6, 35e6)]
)
def test_sizes_shapes_and_params(size, lo, hi, batch):
    model = build_model(cfg(size=size), SPEC, TABLES)
    # the network's own: the texture atlas's table (model.atlas) is the same for every size
    atlas = model.encoder.atlas.table
    own = n_params(model) - (0 if atlas is None else atlas.numel())
    assert lo < own < hi, f"{size}: {own:,} parameters"
    x0, cond = prepare_batch({k: v[:1] for k, v in batch.items()})
    out = randomise(model)(x0, torch.tensor([500]), cond)
    assert out.shape == (1, 3, 64, 64) and torch.isfinite(out).all()


def test_base_flops_near_the_deck_estimate():
    # the deck's model: the trunk at full resolution (the main job's default is patch=2)
    gflops = forward_flops(build_model(cfg(size="base", patch=1), SPEC, TABLES)) / 1e9
    # the deck: "on the order of 50 GFLOP per frame forward", "off by 2x"
    assert 25 < gflops < 100, gflops
    assert forward_flops(build_model(cfg(size="tiny", patch=1), SPEC, TABLES)) < gflops * 1e9 / 20


def test_flops_count_attention():
    """FlopCounterMode has no formula for the fused CPU attention kernel; forward_flops must still
    count QKᵀ and AV."""
    size = lambda attn: UNetSize(width=16, mults=(1, 2, 2), blocks=1, attn=attn, groups=8)
    f = lambda attn: forward_flops(ConditionalUNet(SPEC, cfg(), TABLES, size(attn)))
    # three attention layers at 16×16 over 32 channels: 1 down, 2 up
    n, c = 16 * 16, 32
    per_layer = 2 * n * c * 3 * c + 2 * n * c * c + 2 * (2 * n * n * c)  # qkv, proj, QKᵀ and AV
    assert f((16,)) - f(()) == 3 * per_layer


def test_sizes_are_a_registry():
    assert list(SIZES) == ["tiny", "small", "base"] and SIZES["base"].width == 128
    with pytest.raises(ValueError, match="tiny, small, base"):
        build_model(cfg(size="huge"), SPEC, TABLES)


# ---------------------------------------------------------------- encoders


# the planes each encoding adds, where this file knows them: a material encoding's; a theme
# encoding's (as the theme, as the lighting)
KNOWN_PLANES = {
    MaterialEnc.one_hot: SPEC.n_materials,
    MaterialEnc.embedding: 3,  # material_dim below
    ThemeEnc.planes: (6 + TABLES["theme_pattern"].shape[1], TABLES["lighting_vec"].shape[1]),
    ThemeEnc.id: (0, 0),
    ThemeEnc.param_vector: (0, 0),
}


@pytest.mark.parametrize(
    "material,theme,lighting",
    list(itertools.product(ENCODINGS[MaterialEnc], ENCODINGS[ThemeEnc], ENCODINGS[ThemeEnc])),
)
def test_channel_count_follows_choices_and_spec(material, theme, lighting, batch):
    model = build_model(
        cfg(material_enc=material, theme_enc=theme, lighting_enc=lighting, material_dim=3),
        SPEC,
        TABLES,
    )
    lay = model.encoder.layout
    # sin and cos of u and v at each frequency
    uv = 4 * len(model.encoder.cfg.uv_freqs)
    assert (lay["depth"], lay["surface"], lay["uv"], lay["light"]) == (1, len(SPEC.classes), uv, 1)
    if material in KNOWN_PLANES:
        assert lay["material"] == KNOWN_PLANES[material]
    if theme in KNOWN_PLANES:
        assert lay["theme"] == KNOWN_PLANES[theme][0]
    if lighting in KNOWN_PLANES:
        assert lay["lighting"] == KNOWN_PLANES[lighting][1]
    want = sum(lay.values())
    assert model.encoder.channels == want == len(model.encoder.plane_names)
    assert model.net.conv_in.in_channels == 3 + want
    _, cond = prepare_batch(batch)
    e = model.encode(cond)
    assert e.planes.shape == (4, want, 64, 64)
    has_vec = model.encoder.theme_proj is not None or model.encoder.lighting_proj is not None
    assert (e.vec is None) == (not has_vec)


def test_one_hot_planes_are_exact(batch):
    _, cond = prepare_batch(batch)
    enc = ConditionEncoder(SPEC, cfg(), TABLES, 64)
    p, lay = enc(cond).planes, enc.layout
    surf, mat = (
        p[:, 1 : 1 + lay["surface"]],
        p[:, 1 + lay["surface"] : 1 + lay["surface"] + lay["material"]],
    )
    assert torch.equal(
        surf, torch.nn.functional.one_hot(cond["surface"], 4).permute(0, 3, 1, 2).float()
    )
    wall = cond["material"] != SPEC.material_none
    # none -> all zero, walls -> exactly one 1
    assert torch.equal(mat.sum(1), wall.float())
    assert torch.equal(mat.argmax(1)[wall], cond["material"][wall])
    assert torch.equal(p[:, 0], cond["depth"] * 2 - 1) and torch.equal(
        p[:, enc.plane_names.index("light")], cond["light"] * 2 - 1
    )


def test_material_embedding_none_is_zero_and_untrained(batch):
    enc = ConditionEncoder(SPEC, cfg(material_enc="embedding", material_dim=3), TABLES, 64)
    _, cond = prepare_batch(batch)
    planes = enc(cond).planes[:, 5:8]
    none = cond["material"] == SPEC.material_none
    assert none.any() and (planes.permute(1, 0, 2, 3)[:, none] == 0).all()
    assert (planes.permute(1, 0, 2, 3)[:, ~none] != 0).any()
    planes.sum().backward()
    # the none row never learns
    assert enc.material_emb.weight.grad[SPEC.n_materials].abs().max() == 0


def uv_planes(u, v=0.25):
    # one frequency: the four planes of (u, v), checked by hand below
    enc = ConditionEncoder(SPEC, cfg(uv_freqs=[1]), TABLES, 64)
    _, cond = prepare_batch(synthetic_batch(1))
    cond["uv"] = torch.stack(
        [torch.full((1, 64, 64), float(u)), torch.full((1, 64, 64), float(v))], -1
    )
    return enc(cond).planes[0, 10:14, 0, 0]


def test_uv_wraps():
    # 1.0 is the same place as 0.0
    assert torch.allclose(uv_planes(0.0), uv_planes(1.0), atol=1e-5)
    # across the seam: neighbours
    assert (uv_planes(0.995) - uv_planes(0.005)).norm() < 0.07
    # and far from the other side
    assert (uv_planes(0.5) - uv_planes(0.005)).norm() > 1.9
    assert torch.allclose(uv_planes(0.3, 0.7)[2:], uv_planes(0.9, 0.7)[2:]) and not torch.allclose(
        uv_planes(0.3)[:2], uv_planes(0.9)[:2]
    )


def test_theme_planes_are_the_pixels_palette_colours(batch):
    enc = ConditionEncoder(SPEC, cfg(theme_enc="planes", uv_freqs=[1]), TABLES, 64)
    _, cond = prepare_batch(batch)
    p = enc(cond).planes
    # after depth, surface, material, uv (one frequency: 4 planes), light
    start = 15
    for b in range(4):
        theme = GRID.themes[int(cond["theme"][b])]
        for i, j in [(0, 0), (10, 20), (40, 33), (63, 63)]:
            m, s = int(cond["material"][b, i, j]), SPEC.classes[int(cond["surface"][b, i, j])]
            rgb = (
                theme["palette"]["materials"][m]["base"]
                + theme["palette"]["materials"][m]["accent"]
                if m != SPEC.material_none
                else theme["palette"][s] * 2
            )
            assert torch.allclose(
                (p[b, start : start + 6, i, j] + 1) / 2,
                torch.tensor(rgb, dtype=torch.float32) / 255,
                atol=1e-6,
            )
        pat = theme["pattern"]
        assert torch.allclose(
            (p[b, start + 6 : start + 10, 5, 5] + 1) / 2,
            torch.tensor(
                [(pat["scale"] - 0.25) / 7.75, pat["mortar"] / 0.5, pat["grain"], pat["noise"]]
            ),
            atol=1e-6,
        )


@pytest.mark.parametrize("kind", ENCODINGS[ThemeEnc])
def test_theme_and_lighting_reach_the_output(kind, batch):
    """Each factor changes the output exactly when its encoding passes it on (as planes or a
    vector); the material always does."""
    model = randomise(build_model(cfg(theme_enc=kind), SPEC, TABLES))
    x0, cond = prepare_batch({k: v[:2] for k, v in batch.items()})
    t = torch.tensor([300, 300])
    out = model(x0, t, cond)
    for key, n in [("theme", 5), ("lighting", 4), ("material", None)]:
        other = dict(cond)
        other[key] = (
            (cond[key] + 1) % n if n else torch.where(cond[key] == 255, 255, (cond[key] + 1) % 5)
        )
        passed = key == "material" or bool(
            model.encoder.layout[key] or getattr(model.encoder, f"{key}_proj") is not None
        )
        assert torch.allclose(model(x0, t, other), out) != passed, (
            f"{kind}: changing {key} changes {'nothing' if passed else 'the output'}"
        )


def test_channels_last_gives_the_same_output(batch):
    model = randomise(build_model(cfg(size="tiny", channels_last=False), SPEC, TABLES))
    x0, cond = prepare_batch(batch)
    t = torch.tensor([0, 10, 500, 999])
    ref = model(x0, t, cond)
    assert not model.net.conv_in.weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(model.set_channels_last(True)(x0, t, cond), ref, atol=1e-4)
    assert model.net.conv_in.weight.is_contiguous(memory_format=torch.channels_last)
    assert build_model(cfg(), SPEC, TABLES).channels_last  # the default


def test_state_dict_carries_the_tables(batch):
    a = randomise(build_model(cfg(theme_enc="param_vector"), SPEC, TABLES))
    sd = a.state_dict()
    assert torch.equal(sd["encoder.theme_vec"], torch.as_tensor(TABLES["theme_vec"]))
    b = build_model(cfg(theme_enc="param_vector"), SPEC, TABLES)
    b.load_state_dict(sd)
    x0, cond = prepare_batch(batch)
    t = torch.tensor([1, 2, 3, 4])
    assert torch.equal(a(x0, t, cond), b(x0, t, cond))


# ---------------------------------------------------------------- diffusion vs diffusers


@pytest.fixture(scope="module")
def diffusers():
    return pytest.importorskip(
        "diffusers", reason="diffusers is a dev dependency: pip install diffusers"
    )


DIFFUSERS_SCHEDULE = {"cosine": "squaredcos_cap_v2", "linear": "linear"}
DIFFUSERS_PRED = {"eps": "epsilon", "v": "v_prediction"}


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_schedule_matches_diffusers(schedule, diffusers):
    ref = diffusers.DDPMScheduler(
        num_train_timesteps=1000, beta_schedule=DIFFUSERS_SCHEDULE[schedule]
    ).alphas_cumprod
    ours = Diffusion(schedule).alphas_cumprod
    assert ours.dtype == ref.dtype and torch.allclose(ours, ref, atol=2e-6, rtol=1e-5)
    other = Diffusion("linear" if schedule == "cosine" else "cosine").alphas_cumprod
    assert not torch.allclose(other, ref, atol=1e-3)  # the comparison can fail


@pytest.mark.parametrize("schedule,prediction", [("cosine", "eps"), ("linear", "v")])
def test_noising_and_target_match_diffusers(schedule, prediction, diffusers):
    sch = diffusers.DDPMScheduler(
        num_train_timesteps=1000,
        beta_schedule=DIFFUSERS_SCHEDULE[schedule],
        prediction_type=DIFFUSERS_PRED[prediction],
    )
    d = Diffusion(schedule, prediction=prediction)
    g = torch.Generator().manual_seed(0)
    x0, eps = torch.rand(4, 3, 8, 8, generator=g) * 2 - 1, torch.randn(4, 3, 8, 8, generator=g)
    t = torch.tensor([0, 1, 500, 999])
    assert torch.allclose(d.q_sample(x0, t, eps), sch.add_noise(x0, eps, t), atol=1e-5)
    want = eps if prediction == "eps" else sch.get_velocity(x0, eps, t)
    assert torch.allclose(d.target(x0, t, eps), want, atol=1e-5)


@pytest.mark.parametrize(
    "schedule,prediction,steps,clip,eta",
    [
        ("cosine", "eps", 4, False, 0.0),
        ("linear", "v", 10, False, 0.0),
        ("cosine", "v", 4, True, 0.0),
        ("linear", "eps", 50, False, 0.7),
        ("cosine", "eps", 1, False, 0.0),
    ],
)
def test_ddim_updates_match_diffusers(schedule, prediction, steps, clip, eta, diffusers):
    sch = diffusers.DDIMScheduler(
        num_train_timesteps=1000,
        beta_schedule=DIFFUSERS_SCHEDULE[schedule],
        prediction_type=DIFFUSERS_PRED[prediction],
        clip_sample=clip,
        set_alpha_to_one=True,
        timestep_spacing="trailing",
    )
    sch.set_timesteps(steps)
    d = Diffusion(schedule, prediction=prediction)
    ts = d.ddim_timesteps(steps)
    assert ts == sch.timesteps.tolist()
    g = torch.Generator().manual_seed(steps)
    x = torch.randn(2, 3, 8, 8, generator=g)
    for i, t in enumerate(ts):
        out, noise = torch.randn(x.shape, generator=g) * 1.5, torch.randn(x.shape, generator=g)
        t_prev = ts[i + 1] if i + 1 < len(ts) else -1
        ref = sch.step(
            out, t, x, eta=eta, use_clipped_model_output=clip, variance_noise=noise
        ).prev_sample
        ours = d.ddim_step(
            out, x, t, t_prev, eta=eta, noise=noise if t_prev >= 0 else None, clip=clip
        )
        assert torch.allclose(ours, ref, atol=2e-5, rtol=1e-4), (t, (ours - ref).abs().max())
        wrong = Diffusion(schedule, prediction="v" if prediction == "eps" else "eps").ddim_step(
            out, x, t, t_prev, eta, noise, clip
        )
        assert not torch.allclose(wrong, ref, atol=1e-3)  # the comparison can fail
        x = ref


# ---------------------------------------------------------------- sampler


class Oracle(nn.Module):
    """A 'network' that knows the clean frame: it outputs the exact ε (or v) for any x_t. DDIM must
    then return x0."""

    def __init__(self, x0, diffusion, lie: float = 0.0):
        super().__init__()
        self.x0, self.d, self.lie, self.w = x0, diffusion, lie, nn.Parameter(torch.zeros(()))
        self.spec, self.image_channels = SPEC, 3

    def encode(self, cond):
        return Encoded(torch.zeros(self.x0.shape[0], 0, 64, 64), None)

    def forward(self, x_t, t, cond):
        a, s = self.d.coefs(t, x_t)
        eps = (x_t - a * self.x0) / s + self.lie
        return eps if self.d.prediction == "eps" else a * eps - s * self.x0


# ε-prediction under the cosine schedule recovers x0 at t = T-1 by dividing by √ᾱ ≈ 5e-5, so float32
# rounding of x_t grows 2e4-fold there (~2e-3); v-prediction, or the linear schedule (√ᾱ ≈ 6e-3),
# stay at ~1e-5.
@pytest.mark.parametrize(
    "schedule,prediction,atol",
    [("cosine", "v", 1e-4), ("linear", "eps", 1e-4), ("cosine", "eps", 5e-3)],
)
def test_ddim_with_an_oracle_returns_x0_for_any_step_count(schedule, prediction, atol):
    d = Diffusion(schedule, prediction=prediction)
    x0 = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0)) * 1.8 - 0.9
    for steps in (1, 2, 3, 4, 7, 8, 100, 1000):
        out = ddim_sample(
            Oracle(x0, d), {}, d, steps, torch.Generator().manual_seed(steps), clip=False
        )
        assert torch.allclose(out, x0, atol=atol), (steps, (out - x0).abs().max())
    assert not torch.allclose(
        ddim_sample(Oracle(x0, d, lie=0.1), {}, d, 4, torch.Generator().manual_seed(0), clip=False),
        x0,
        atol=1e-2,
    )
    with pytest.raises(ValueError, match="1..1000"):
        ddim_sample(Oracle(x0, d), {}, d, 0)


@pytest.mark.parametrize("eta", [0.0, 1.0])
def test_ddim_is_deterministic_given_a_generator(eta, batch):
    model, d = randomise(build_model(cfg(), SPEC, TABLES)), Diffusion()
    _, cond = prepare_batch({k: v[:2] for k, v in batch.items()})
    run = lambda seed: ddim_sample(model, cond, d, 3, torch.Generator().manual_seed(seed), eta=eta)
    a = run(0)
    torch.randn(100)  # the global RNG is not used
    assert torch.equal(a, run(0)) and not torch.allclose(a, run(1))
    # clipped to the frame's range; mode restored
    assert a.abs().max() <= 1 and model.training


def test_ema_average():
    net = nn.Linear(3, 2)
    ema = make_ema(net, decay=0.8)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    ema.update_parameters(net)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    ema.update_parameters(net)
    for k, v in ema.module.state_dict().items():
        assert torch.allclose(v, 0.8 * before[k] + 0.2 * (before[k] + 1)), k
    assert not any(p.requires_grad for p in ema.parameters())


def test_ema_skips_a_non_finite_step_and_loads_averaged_model_checkpoints():
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    net = nn.Linear(3, 2)
    ema = make_ema(net, decay=0.8, warmup=10)
    ema.update_parameters(net)
    kept = {k: v.clone() for k, v in ema.state_dict().items()}
    with torch.no_grad():
        net.weight.add_(1.0)
    ema.update_parameters(net, torch.tensor(False))
    # average and count as they were
    assert all(torch.equal(v, kept[k]) for k, v in ema.state_dict().items())
    ema.update_parameters(net, torch.tensor(True))
    assert not torch.equal(ema.module.weight, kept["module.weight"]) and int(ema.n_averaged) == 2
    # what checkpoints held before
    old = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(0.8), use_buffers=True)
    old.update_parameters(net)
    fresh = make_ema(nn.Linear(3, 2), 0.8)
    fresh.load_state_dict(old.state_dict())
    assert torch.equal(fresh.module.weight, net.weight) and int(fresh.n_averaged) == 1


def test_encoder_reads_no_value_from_a_device_tensor(batch):
    """On the meta device every value read raises: the forward pass must not need one (a host sync
    on a GPU)."""
    model = build_model(cfg(size="tiny"), SPEC, TABLES).to("meta")
    x0, cond = prepare_batch(batch, "meta")
    out = model(x0, torch.zeros(len(x0), dtype=torch.long, device="meta"), cond)
    assert out.shape == x0.shape and out.device.type == "meta"
    # the check that reads, on its own
    with pytest.raises(NotImplementedError):
        model.encoder.check_ids(cond)


# ---------------------------------------------------------------- the deck's third CI test


@pytest.fixture
def one_thread():
    """One intra-op thread: on two shared cores, a second thread that loses its core stalls every op
    (3-5x slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_tiny_model_overfits_one_batch(batch, one_thread):
    torch.manual_seed(0)
    # the full-resolution trunk, whose figures the comment below gives (model.patch=1)
    model = build_model(cfg(size="tiny", patch=1), SPEC, TABLES)
    x0, cond = prepare_batch({k: v[:2] for k, v in batch.items()})
    # ε and its own MSE (train.loss=target: the x0 it implies divides by √ᾱ ~ 5e-5 at t near T):
    # the loss starts at ~1; here it is 0.019 at step 100 and 0.0023 at 150 (0.0011 at 300, for
    # twice the time)
    losses = overfit_one_batch(
        model, Diffusion(prediction="eps"), x0, cond, steps=150, lr=2e-3, loss="target"
    )
    assert losses[0] > 0.5 and losses[-1] < 1e-2, (losses[0], losses[-1])


def test_diffusion_loss_is_seeded(batch):
    model = randomise(build_model(cfg(prediction="v"), SPEC, TABLES))
    x0, cond = prepare_batch({k: v[:2] for k, v in batch.items()})
    d = Diffusion.from_config(cfg(prediction="v", schedule="linear"))
    assert (d.prediction, d.schedule) == ("v", "linear")
    loss = lambda s: diffusion_loss(model, d, x0, cond, torch.Generator().manual_seed(s))
    assert torch.equal(loss(0), loss(0)) and not torch.equal(loss(0), loss(1))


# ---------------------------------------------------------------- bad input


def mutate(batch, **changes):
    b = dict(batch)
    for k, f in changes.items():
        b[k] = f(b[k])
    return b


@pytest.mark.parametrize(
    "change,match",
    [
        (
            dict(depth=lambda x: x.float()),
            r"batch\['depth'\]: expected shape \[B, H, W\] = \(4, 64, 64\) and dtype "
            r"float16, got \(4, 64, 64\) float32",
        ),
        (
            dict(surface=lambda x: x[:, :, :32]),
            r"batch\['surface'\]: expected shape \[B, H, W\] = \(4, 64, 64\)",
        ),
        (
            dict(uv=lambda x: x.permute(0, 3, 1, 2)),
            r"batch\['uv'\]: expected shape \[B, H, W, 2\] = \(4, 64, 64, 2\)",
        ),
        (
            dict(rgb=lambda x: x[..., :2]),
            r"batch\['rgb'\]: expected shape \[B, H, W, 3\] = \(4, 64, 64, 3\)",
        ),
        (
            dict(theme=lambda x: x.float()),
            r"batch\['theme'\]: expected shape \[B\] = \(4,\) and an integer dtype",
        ),
        (dict(lighting=lambda x: x[:2]), r"batch\['lighting'\]: expected shape \[B\] = \(4,\)"),
    ],
)
def test_bad_batches_are_named(change, match, batch):
    with pytest.raises(ModelInputError, match=match):
        prepare_batch(mutate(batch, **change))


@pytest.mark.parametrize(
    "key,f,match",
    [
        (
            "material",
            lambda x: torch.where(x == 255, x, 5),
            r"cond\['material'\]: material ids must be 0..4 or none=255, found \[5\]",
        ),
        ("theme", lambda x: x + 5, r"cond\['theme'\]: theme ids must be 0..4"),
        ("lighting", lambda x: x - 10, r"cond\['lighting'\]: lighting ids must be 0..3"),
        ("surface", lambda x: x + 4, r"cond\['surface'\]: class ids must be 0..3"),
        (
            "depth",
            lambda x: x[:, :32],
            r"cond\['depth'\]: expected shape \[B, H, W\] = \(4, 64, 64\)",
        ),
        (
            "theme",
            lambda x: x.float(),
            r"cond\['theme'\]: expected shape \[B\] = \(4,\) and an integer dtype",
        ),
    ],
)
def test_bad_conditions_are_named(key, f, match, batch):
    model = build_model(cfg(), SPEC, TABLES)
    x0, cond = prepare_batch(batch)
    with pytest.raises(ModelInputError, match=match):
        model(x0, torch.zeros(4, dtype=torch.long), mutate(cond, **{key: f}))


def test_bad_model_inputs_are_named(batch):
    model = build_model(cfg(), SPEC, TABLES)
    x0, cond = prepare_batch(batch)
    t = torch.zeros(4, dtype=torch.long)
    with pytest.raises(
        ModelInputError,
        match=r"x_t: expected shape \[B, 3, H, W\] = \(4, 3, 64, 64\).*got \(4, 4, 64, 64\)",
    ):
        model(torch.cat([x0, x0[:, :1]], 1), t, cond)
    with pytest.raises(ModelInputError, match=r"x_t: .*\(4, 3, 64, 64\).*got \(4, 3, 32, 32\)"):
        model(x0[..., :32, :32], t, cond)
    e, C = model.encode(cond), model.encoder.channels  # 79: the main job's encodings
    with pytest.raises(
        ModelInputError,
        match=rf"cond.planes: expected shape \[B, C_cond, H, W\] = \(4, {C}, 64, 64\)",
    ):
        model(x0, t, Encoded(e.planes[:, : C - 1], e.vec))
    with pytest.raises(ModelInputError, match=r"cond\['light'\]: missing"):
        model(x0, t, {k: v for k, v in cond.items() if k != "light"})
    with pytest.raises(ValueError, match="one_hot, embedding"):
        build_model(cfg(material_enc="rgb"), SPEC, TABLES)
    with pytest.raises(ValueError, match="cosine, linear"):
        Diffusion.from_config(cfg(schedule="quadratic"))


# ---------------------------------------------------------------- benchmark code paths (numbers are
# not tested)


def test_bench_paths_run_on_cpu(diffusers):
    r = bench_throughput(
        "cpu", size="tiny", batch=2, iters=1, warmup=0, peak_n=128, channels_last=False
    )
    assert r["mfu"] > 0 and r["frames_per_s"] > 0 and r["achieved_tflops"] > 0
    # bench_throughput's network: the trunk at full resolution, as the GPU recipe's
    fwd = forward_flops(build_model(cfg(size="tiny", patch=1), SPEC, TABLES))
    # forward + backward ≈ 3 × forward
    assert 2.5 < r["train_gflop_per_step"] * 1e9 / (2 * fwd) < 3.5
    r = bench_cpu(size="tiny", batch=1, iters=1, warmup=1, compile=False)
    assert r["params_ours"] > 0 and r["params_diffusers"] > 0 and r["diffusers_over_ours"] > 0
    assert 0.7 < r["params_diffusers"] / r["params_ours"] < 1.3  # comparable layouts
    assert {"step_s_ours", "step_s_ours_bf16_channels_last", "diffusers_over_ours_bf16"} <= set(r)


def test_defaults_live_in_the_config():
    """Diffusion() and build_model() are what a default config builds (Diffusion() was
    ε-prediction, the config says v), and hold the config's enums, not strings."""
    from qmind_render.core.config import load_config

    m = load_config().model
    # the default config is the main job's regression control; as a diffusion model it is
    # Diffusion()'s process
    assert repr(Diffusion.from_config(m)) == repr(Diffusion.from_config()) == "Regression()"
    d = load_config(None, ["model.regression=false"]).model
    assert repr(Diffusion()) == repr(Diffusion.from_config(d)) and Diffusion().prediction == "v"
    a, b = build_model(None, SPEC, TABLES), build_model(m, SPEC, TABLES)
    assert (a.size_name, a.cfg, a.channels_last, n_params(a)) == (
        b.size_name,
        b.cfg,
        b.channels_last,
        n_params(b),
    )
    assert type(Diffusion.from_config(d).schedule) is Schedule
    assert type(b.cfg.theme_enc) is ThemeEnc and type(model_config(theme_enc="id").theme_enc) is str
    with pytest.raises(ValueError, match="model.prediction='x0' is not one of eps, v"):
        Diffusion.from_config(model_config(regression=False, prediction="x0"))


def test_the_model_module_is_the_network():
    """The network's inputs, the diffusion process, training loops, the benchmark and weights files
    live in their own modules, each name in one home."""
    import qmind_render.core.model as model
    from qmind_render.core import checkpoint, diffusion, encodings, model_bench, train

    # the inputs (checks, encodings, batches) and the process (schedule, objective, DDIM): their own
    inputs = {
        "ModelInputError",
        "check_tensor",
        "ENCODINGS",
        "register",
        "condition_tables",
        "ConditionEncoder",
        "COND_KEYS",
        "prepare_batch",
        "synthetic_batch",
    }
    process = {
        "make_schedule",
        "Diffusion",
        "draw_noise",
        "min_snr_weight",
        "diffusion_loss",
        "ddim_sample",
        "to_uint8",
    }
    assert inputs <= set(encodings.__all__) and process <= set(diffusion.__all__)
    assert {"UNet", "ConditionalUNet", "SIZES", "build_model", "n_params"} <= set(model.__all__)
    assert not (inputs | process) & set(model.__all__) and not process & set(vars(model))
    assert not process & set(vars(encodings))
    assert (
        diffusion.Diffusion.__module__ == "qmind_render.core.diffusion"
        and encodings.ConditionEncoder.__module__ == "qmind_render.core.encodings"
        and model.ConditionalUNet.encode.__module__ == "qmind_render.core.model"
    )

    assert (
        train.quick_train.__module__ == "qmind_render.core.train"
        and train.overfit_one_batch.__module__ == "qmind_render.core.train"
    )
    assert (
        model_bench.bench_model.__module__ == "qmind_render.core.model_bench"
        and checkpoint.load_shipped.__module__ == "qmind_render.core.checkpoint"
    )
    assert not hasattr(model, "quick_train") and not hasattr(model, "load_shipped")
    assert not {
        "quick_train",
        "overfit_one_batch",
        "bench_model",
        "bench_cpu",
        "load_shipped",
    } & set(vars(model))
    from qmind_render.core import optim

    # the training machinery: the optimiser stage
    moved = {"EMA", "make_ema", "make_optimizer", "masked_step"}
    assert (
        moved <= set(optim.__all__)
        and not moved & set(vars(model))
        and train.make_ema is optim.make_ema
    )
