"""One home for each piece of knowledge (issue 20): files a later stage trusts are written through
util's atomic writers, one process pool, one table formatter, one precision -> dtype map, the grid's
size read from the grid file, config defaults written once, no private name imported across modules
(tests/test_layout.py checks the layout: one concern per module, imports down the chapters). The
static checks read the generated modules as text; the others run the code."""

import ast
import dataclasses
import inspect
import os
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "qmind_render"
MODULES = sorted(
    p
    for p in PKG.rglob("*.py")
    if p.name not in ("_modidx.py", "__init__.py") and p.parent.name != "assets"
)


def _hits(pattern: str, allowed: dict[str, tuple[str, ...]], skip=("util.py",)) -> list[str]:
    """Lines of the modules (but `skip`) that match `pattern`, less those holding one of
    `allowed[module]`'s snippets."""
    out = []
    for p in MODULES:
        if p.name in skip:
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if re.search(pattern, line) and not any(a in line for a in allowed.get(p.name, ())):
                out.append(f"{p.name}:{i}: {line.strip()}")
    return out


# What may write a file directly, and why: in-memory buffers, appends (a crash cuts at most the last
# line), a build's own temporary folder (docs: swapped in whole by util.atomic_dir), a writer handed
# util.atomic_write's temporary path.
WRITES_ALLOWED = {
    # a response body in memory
    "protocol.py": ("np.save(buf", ".save(buf"),
    "explorer.py": (".save(buf",),  # a PNG in memory, for the widget
    # a zip member, in memory
    "dataset.py": ("z.open(info",),
    "checkpoint.py": ("atomic_write(path, write=lambda tmp: torch.save",),
    "website.py": (
        "out.write_text(local_links",
        "(out.parent / name).write_bytes",
        '(docs / "qmind.css")',
        '(docs / "talks" / "index.md")',
        '(work / "mkdocs.yml")',
        "shutil.copyfile(cached, dst)",
        # the build's temporary work folder
        "shutil.copyfile(src, executed)",
    ),
    "sweep.py": ('open(rd / "kernel.log", "ab")',),  # an append-only log
    # metrics.jsonl, appended a line at a time
    "tracking.py": ('self.path.open("a")',),
    # write_gif: evaluate hands it a temporary path
    "viz.py": ("imgs[0].save(path, save_all=True",),
}
WRITE = (
    r"\.write_text\(|\.write_bytes\(|\.savefig\(|np\.savez?\(|open\([^)]*[\"'](w|a|x)b?[\"']|\.save\("
    r"|os\.rename\(|os\.replace\(|copyfile\(|\.rename\("
)


def test_files_later_stages_trust_are_written_through_util():
    assert not _hits(WRITE, WRITES_ALLOWED), (
        "write these through util.atomic_write / save_figure / save_image / atomic_dir:\n"
        + "\n".join(_hits(WRITE, WRITES_ALLOWED))
    )


def test_one_process_pool_one_table_formatter_one_precision_map():
    assert not _hits(r"ProcessPoolExecutor\(|\.Pool\(|get_context\(", {}), (
        "pools come from util.process_pool / pool_map"
    )
    assert not _hits(r"\|-{2,3}:?\|", {}), (
        "markdown tables come from util.format_table(markdown=True)"
    )
    assert not _hits(
        r"precision.*bfloat16|bfloat16.*precision", {}, skip=("util.py", "device.py")
    ), "a precision becomes a dtype in device.precision_dtype"
    assert not _hits(r"SimpleNamespace", {}), (
        "configs are the config dataclasses (DataConfig(...), dataclasses.replace)"
    )
    assert not _hits(
        r"\.parent\.parent\b|== .checkpoints.",
        {"contracts.py": ("qmind_render.__file__",)},
        skip=("util.py", "checkpoint.py"),
    ), "a checkpoint's run dir is checkpoint.run_dir_of"


def test_no_private_name_is_imported_across_modules():
    bad = []
    for p in MODULES:
        for node in ast.walk(ast.parse(p.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and (node.level or node.module.startswith("qmind_render"))
            ):
                here = node.module.rsplit(".", 1)[-1] == p.stem
                bad += [
                    f"{p.name}: from {'.' * node.level}{node.module} import {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__") and not here
                ]
    assert not bad, "make what chapters share public (in __all__), or move it:\n" + "\n".join(bad)


def _config_defaults() -> dict[str, list]:
    from qmind_render.core import config as C
    from qmind_render.serve.settings import ServeSettings

    out = {}
    for cls in (
        C.DataConfig,
        C.ModelConfig,
        C.TrainConfig,
        C.EvalConfig,
        C.ExperimentConfig,
        ServeSettings,
    ):
        for f in dataclasses.fields(cls):
            v = (
                f.default
                if f.default is not dataclasses.MISSING
                else f.default_factory()
                if f.default_factory is not dataclasses.MISSING
                else None
            )
            out.setdefault(f.name, []).append(
                (cls.__name__, getattr(v, "value", tuple(v) if isinstance(v, list) else v))
            )
    return out


# Benchmarks' measurement points and the toy loops' own settings, which are theirs to choose (a
# changed train.batch must not move the GPU targets, nor a changed train.lr the one-batch overfit);
# some equal the main job's defaults, which are not what they mean.
BENCH_POINTS = {
    ("gpu.py", "loop_config", "batch"),
    ("model_bench.py", "bench_throughput", "batch"),
    ("model_bench.py", "bench_cpu", "batch"),
    ("train.py", "overfit_one_batch", "lr"),
    ("train.py", "quick_train", "batch"),
    ("data_cli.py", "bench_data", "batch"),
}


def test_config_defaults_are_written_once():
    """No function or dataclass repeats a config dataclass's default as a literal default of a
    same-named parameter."""
    fields, bad = _config_defaults(), []
    for p in MODULES:
        if p.name == "config.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            pairs = list(zip(a.args[len(a.args) - len(a.defaults) :], a.defaults)) + list(
                zip(a.kwonlyargs, a.kw_defaults)
            )
            for arg, d in pairs:
                try:
                    val = ast.literal_eval(d) if d is not None else None
                except ValueError:
                    continue
                val = tuple(val) if isinstance(val, list) else val
                if (
                    val in (None, 0, False, True, "", ())
                    or (p.name, node.name, arg.arg) in BENCH_POINTS
                ):
                    continue
                bad += [
                    f"{p.name}:{node.lineno} {node.name}({arg.arg}={val!r}) repeats {c}.{arg.arg}"
                    for c, v in fields.get(arg.arg, [])
                    if v == val
                ]
    assert not bad, "\n".join(bad)
    from qmind_render.core.checkpoint import save_checkpoint
    from qmind_render.core.yardsticks import fit_classifier
    from qmind_render.data.loader import make_loader
    from qmind_render.core.optim import EMA, make_ema
    from qmind_render.serve.protocol import RenderItem, render_item

    required = {
        save_checkpoint: "keep_last",
        make_ema: "decay",
        EMA.__init__: "decay",
        fit_classifier: "steps",
        render_item: "steps",
        RenderItem: "steps",
        make_loader: "batch",
    }
    assert all(
        inspect.signature(f).parameters[k].default is inspect.Parameter.empty
        for f, k in required.items()
    )


def test_the_grid_file_is_the_one_source_of_the_grid_size(tmp_path, monkeypatch):
    """A grid file with four themes: every default that sizes the grid follows it (it was 5 x 5 x 4,
    written in four places)."""
    import yaml

    import qmind_render.world.grid as G
    from qmind_render.world.cells import cell_mask
    from qmind_render.data.dataset import DatasetWriter, Grid
    from qmind_render.core.encodings import synthetic_batch
    from qmind_render.data.splits import make_split
    from qmind_render.data.stores import open_store

    d = yaml.safe_load(G.grid_path().read_text())
    d["themes"] = d["themes"][:4]
    (small := tmp_path / "grid.yaml").write_text(yaml.safe_dump(d))
    monkeypatch.setattr(G, "grid_path", lambda: small)
    want = Grid(4, 5, 4)
    assert Grid.of() == Grid.of(G.load_grid()) == want
    assert (
        make_split("random_15").grid == want
        and DatasetWriter(open_store(tmp_path / "store"), "ds-g").grid == want
    )
    b = synthetic_batch(3)
    assert b["cells"].shape == (3, want.n_cells) and int(b["theme"].max()) < 4
    assert cell_mask(
        {k: b[k].numpy() for k in ("material", "surface")},
        b["theme"].numpy(),
        b["lighting"].numpy(),
    ).shape == (3, 80)
    with pytest.raises(TypeError):
        # no numeric defaults
        Grid()


def test_the_cloud_backends_share_one_submit_and_one_session():
    from qmind_render.sweeps.cloud import AwsBackend
    from qmind_render.sweeps.cloud_batch import BatchDataJobs
    from qmind_render.sweeps.cloud_jobs import CappedJobs, EC2Backend, SageMakerBackend

    assert EC2Backend.submit is SageMakerBackend.submit is CappedJobs.submit
    assert EC2Backend.launch is not SageMakerBackend.launch
    assert all(
        c.get_session is AwsBackend.get_session
        for c in (EC2Backend, SageMakerBackend, BatchDataJobs)
    )


def test_served_name_is_the_checkpoints_run():
    from qmind_render.serve.renderer import Served

    name = lambda src: Served(None, None, None, None, src).name
    assert (name("runs/r7/checkpoints/0000300.pt"), name("elsewhere/ck.pt"), name("shipped")) == (
        "r7/0000300.pt",
        "elsewhere/ck.pt",
        "shipped",
    )


def test_a_failed_truncate_leaves_the_metrics_log_whole(tmp_path, monkeypatch):
    """Resuming rewrites metrics.jsonl without the lines after the checkpoint; a write that fails
    leaves the log as it was."""
    from qmind_render.core.config import load_config
    from qmind_render.core.tracking import Tracker

    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(f'{{"step": {s}, "loss": 1.0}}\n' for s in (10, 20, 30)))

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        Tracker(tmp_path, load_config(None, ["tracker=none"]), resume_step=20)
    assert log.read_text().count("step") == 3 and sorted(p.name for p in tmp_path.iterdir()) == [
        "metrics.jsonl"
    ]
    monkeypatch.undo()
    Tracker(tmp_path, load_config(None, ["tracker=none"]), resume_step=20)
    assert [line.split(",")[0] for line in log.read_text().splitlines()] == [
        '{"step": 10',
        '{"step": 20',
    ]
