"""Defaults in one home (issue 42): the config dataclasses' defaults are the main job's recipe, and
what every config that was run resolves to stays what it was.

`sweeps/exp/quickstart.yaml` (the main job, `qmind run quickstart`) names only keys it would change
for time; everything else it gets from the defaults.

tests/golden/configs.json holds, as `config_to_dict` gives them, every experiment config
(`sweeps/exp/*.yaml`, by `load_config(name)`), every run of every sweep file (`sweeps/*.yaml`, by
`expand_sweep`) and every committed saved config (the run dirs' config.yaml under results/ and
tests/golden/, the checkpoints' configs), resolved by the code before the config dataclasses'
defaults became the main job's recipe (b100a69). The same resolution must give the same dicts, so
the committed results under results/ stay the runs their configs name. Remake the file only for a
change that means to move a run (and say so):

    PYTHONPATH=. python tests/test_config_defaults.py
"""

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "configs.json"
SHIPPED = ROOT / "qmind_render" / "assets" / "shipped.pt"


def resolved() -> dict[str, dict]:
    "Every config that was run, resolved by the code on the path: {group: {name: config dict}}."
    from qmind_render.core.config import config_from_dict, config_to_dict, load_config
    from qmind_render.sweeps.sweep import expand_sweep

    out = {"exp": {}, "sweep": {}, "saved": {}}
    for p in sorted((ROOT / "sweeps" / "exp").glob("*.yaml")):
        out["exp"][p.stem] = config_to_dict(load_config(p.stem, root=ROOT))
    for p in sorted((ROOT / "sweeps").glob("*.yaml")):
        out["sweep"] |= {f"{p.stem}/{r.name}": r.config for r in expand_sweep(p, (), ROOT)}
    saved = sorted([*(ROOT / "results").rglob("config.yaml"), *GOLDEN.parent.rglob("config.yaml")])
    for p in saved:
        cfg = config_from_dict(yaml.safe_load(p.read_text()))
        out["saved"][str(p.relative_to(ROOT))] = config_to_dict(cfg)
    for p in [SHIPPED, *sorted(GOLDEN.parent.rglob("*.pt"))]:
        ck = torch.load(p, weights_only=True, map_location="cpu")
        out["saved"][str(p.relative_to(ROOT))] = config_to_dict(config_from_dict(ck["config"]))
    return out


# The keys the main job may set apart from the defaults: each trades time (of a run on 2 CPU cores)
# against quality or a figure's detail, never what the model is or how it learns.
FOR_TIME = {
    "train.steps",  # how long it trains
    "train.finetune_steps",  # a share of those steps (the last quarter)
    "train.sample_every",  # sample grids take seconds each
    "train.log_every",
    "data.episodes",  # how many frames it renders and reads
    "data.frames_per_episode",
    "eval.frames_per_cell",  # how many frames the evaluation renders
    "eval.ddim_steps",
    "eval.classifier_steps",
    "eval.temporal_walks",
    "eval.temporal_frames",
}


def _flat(d: dict, prefix: str = "") -> dict:
    return {
        k2: v2
        for k, v in d.items()
        for k2, v2 in (
            _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
        ).items()
    }


def test_the_main_job_is_the_defaults_but_for_time():
    from qmind_render.core.config import config_to_dict, load_config

    named = set(_flat(yaml.safe_load((ROOT / "sweeps" / "exp" / "quickstart.yaml").read_text())))
    assert named - {"name"} <= FOR_TIME, (
        f"quickstart.yaml sets {sorted(named - {'name'} - FOR_TIME)}, which are not for time: "
        "make them the defaults (nbs/core/01_config.ipynb) instead"
    )
    main, dflt = (_flat(config_to_dict(load_config(c, root=ROOT))) for c in ("quickstart", None))
    assert {k for k in dflt if main[k] != dflt[k]} <= named


@pytest.fixture(scope="module")
def now():
    mp = pytest.MonkeyPatch()
    mp.delenv("QMIND_STORE", raising=False)  # data.store's default reads it
    try:
        yield resolved()
    finally:
        mp.undo()


@pytest.mark.parametrize("group", ["exp", "sweep", "saved"])
def test_every_config_that_was_run_resolves_as_before(now, group):
    before = json.loads(GOLDEN.read_text())[group]
    assert sorted(now[group]) == sorted(before), f"{group}: the configs are not the recorded ones"
    for name, want in before.items():
        assert now[group][name] == want, f"{group}/{name} resolves differently from before"


if __name__ == "__main__":
    import os

    os.environ.pop("QMIND_STORE", None)
    sys.path.insert(0, str(ROOT))
    GOLDEN.write_text(json.dumps(resolved(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN.relative_to(ROOT)}")
