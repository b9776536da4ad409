"""The evaluation's typed result (issue 42): eval.json round-trips through `EvalResult`, every
committed eval.json (schema 1, before the schema was written) reads and writes back unchanged but
for what schema 2 adds, a newer schema is refused in one line, one rule picks the headline step
count (the training cells' best PSNR, never the held-out cells'), and the `ddim_K` spelling lives
in `core/eval_result.py` alone."""

import ast
import json
import re
from pathlib import Path

import pytest

from qmind_render.contracts import UserError
from qmind_render.core.eval_result import (
    SCHEMA,
    EvalResult,
    EvalResultError,
    Part,
    Temporal,
    choose_headline,
    summary_headline,
    summary_psnr,
)

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted((ROOT / "results").glob("**/eval.json"))

# a made-up result where the three rules the workbook had disagree: the largest step count (8),
# the smallest (1), the best held-out PSNR (2); the training cells score best at 4
HELD = {1: 24.0, 2: 26.6, 4: 26.1, 8: 25.8}
TRAIN = {1: 26.0, 2: 27.5, 4: 28.2, 8: 27.9}


def made_up(**kw) -> EvalResult:
    def part(ps, t=None):
        at = {
            k: {
                "psnr": v,
                "ssim": 0.5,
                "lpips": None,
                "classifier": {"theme": 0.9, "lighting": 0.5},
            }
            for k, v in ps.items()
        }
        return Part(40, at, {"psnr": 19.0, "ssim": 0.3}, {"theme": 1.0, "lighting": 1.0}, t)

    t = Temporal(2, 16, 0.8, 3.5, {k: {"rms": 4.0 + k, "excess": 0.5 + k} for k in HELD})
    ev = EvalResult(
        sorted(HELD),
        {"heldout": part(HELD, t), "train": part(TRAIN)},
        checkpoint="/runs/x/checkpoints/0000100.pt",
        step=100,
        frames="walks",
        **kw,
    )
    k = ev.headline_steps
    ev.seen = {"trained": Part(80, {k: {"psnr": 29.0}}), "unseen": Part(80, {k: {"psnr": 28.0}})}
    ev.memorised, ev.gap = {k: 1.0}, {j: TRAIN[j] - HELD[j] for j in HELD}
    ev.gap_matched = {k: {"gap": 0.4, "se": 0.1, "cells": 15, "cell_gap": 2.1}}
    return ev


def test_the_headline_is_the_training_cells_best_not_max_min_or_the_held_out_best():
    assert (max(HELD), min(HELD), max(HELD, key=HELD.get)) == (8, 1, 2)
    ev = made_up()
    assert ev.headline_steps == choose_headline(TRAIN) == 4
    assert (ev.headline_psnr("heldout"), ev.headline_psnr("train")) == (26.1, 28.2)
    # ties go to fewer steps; a recorded headline is kept
    assert choose_headline({8: 28.0, 2: 28.0, 1: 27.0}) == 2
    assert made_up(headline_steps=2).headline_steps == 2


def test_a_result_round_trips_through_eval_json(tmp_path):
    ev = made_up()
    p = ev.write(tmp_path / "eval" / "eval.json")
    raw = json.loads(p.read_text())
    assert list(raw)[:1] == ["schema"] and (raw["schema"], raw["headline_steps"]) == (SCHEMA, 4)
    # the file spells step counts ddim_K, as every committed eval.json does
    assert set(raw["gap"]) == {"ddim_1", "ddim_2", "ddim_4", "ddim_8"}
    assert raw["parts"]["heldout"]["temporal"]["ddim_8"] == {"rms": 12.0, "excess": 8.5}
    back = EvalResult.read(p)
    assert back == ev and back.to_json() == raw
    assert EvalResult.of_run(tmp_path) == ev


def test_a_file_from_before_the_schema_reads_with_the_same_rule(tmp_path):
    legacy = {k: v for k, v in made_up().to_json().items() if k not in ("schema", "headline_steps")}
    (tmp_path / "eval.json").write_text(json.dumps(legacy))
    ev = EvalResult.read(tmp_path / "eval.json")
    assert ev == made_up() and ev.headline_steps == 4


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_every_committed_eval_json_reads_and_writes_back_unchanged(path):
    """Every eval.json under results/: one this evaluation wrote (schema 4) read and written back
    the same, one of schema 3 the same but for the schema; an older one (schema 1) read, its
    headline chosen by the rule (1 step for every one of them), written back the same but for the
    schema, the headline and, for the oldest, `frames: dataset`."""
    d = json.loads(path.read_text())
    ev = EvalResult.read(path)
    if d.get("schema") == SCHEMA:  # written by this evaluation: read and written back the same
        assert ev.to_json() == d and ev.headline_from == "validation"
        return
    if d.get("schema") == 3:  # validation and test cells, before `timesteps`: only the schema moves
        assert ev.to_json() == d | {"schema": SCHEMA} and ev.timesteps == {}
        return
    assert "schema" not in d and ev.headline_steps == 1
    assert ev.to_json() == d | {
        "schema": SCHEMA,
        "headline_steps": 1,
        "headline_from": "train",
        "frames": ev.frames,
    }
    assert ev.frames == d.get("frames", "dataset")


def test_all_committed_results_are_read():
    assert len(COMMITTED) >= 49


@pytest.mark.parametrize("schema", [SCHEMA + 1, 99, "2", 0])
def test_a_newer_or_unknown_schema_is_refused_in_one_line(tmp_path, schema):
    p = tmp_path / "eval.json"
    p.write_text(json.dumps(made_up().to_json() | {"schema": schema}))
    with pytest.raises(EvalResultError) as e:
        EvalResult.read(p)
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg
    assert msg.startswith(
        f"{p}: eval.json schema {schema!r}, but this qmind-render reads schemas 1"
    )
    assert f"to {SCHEMA}" in msg


def test_a_file_that_is_not_a_result_is_one_line(tmp_path):
    p = tmp_path / "eval.json"
    d = made_up().to_json()
    for bad, said in [
        (d | {"parts": {"heldout": d["parts"]["heldout"]}}, "no 'train' part"),
        (d | {"colour": 1}, "unknown key 'colour'"),
        ({k: v for k, v in d.items() if k != "ddim_steps"}, "ddim_steps"),
        (d | {"headline_steps": 3}, "headline_steps 3 is not one of [1, 2, 4, 8]"),
        # a legacy file (no headline recorded) whose training part has no PSNR to choose on
        (
            {k: v for k, v in d.items() if k != "headline_steps"}
            | {"parts": d["parts"] | {"train": {"frames": 4}}},
            "no train-cell PSNR at each",
        ),
    ]:
        p.write_text(json.dumps(bad))
        with pytest.raises(EvalResultError, match=re.escape(said)) as e:
            EvalResult.read(p)
        assert str(e.value).startswith(str(p)) and "\n" not in str(e.value)
    p.write_text("{")
    assert EvalResult.read(p, missing_ok=True) is None
    with pytest.raises(EvalResultError, match="no evaluation to read"):
        EvalResult.read(p)
    assert EvalResult.read(tmp_path / "none.json", missing_ok=True) is None


def test_the_shipped_summary_keeps_the_headline_and_an_old_one_gets_it_by_the_rule():
    from qmind_render.core.checkpoint import load_shipped

    s = made_up().summary()
    assert (summary_psnr(s, "heldout"), s["headline_steps"]) == (HELD, 4)
    # the shipped model carries its evaluation on validation and test cells: 1 step, chosen on the
    # validation cells; a summary from before the headline was recorded gets it by the rule
    m = load_shipped()[2]["metrics"]
    assert (m["headline_steps"], m["headline_from"], summary_headline(m)) == (1, "validation", 1)
    assert summary_psnr(m, "heldout") == summary_psnr(m, "test")
    old = {p: m[p] for p in ("train",)} | {"heldout": m["test"]}
    assert summary_headline(old) == 1
    assert summary_headline({"heldout": {"ddim_2": 30.0}}) is None


def test_run_row_reads_at_the_headline(tmp_path):
    from qmind_render.sweeps.sweep_report import run_row

    made_up().write(tmp_path / "r" / "eval.json")
    (tmp_path / "r" / "config.yaml").write_text("name: r\nseed: 3\n")
    row = run_row(tmp_path / "r")
    assert [row[f"held-out {k}"] for k in HELD] == ["24.00", "26.60", "26.10", "25.80"]
    assert (row["train 4"], row["gap 4"], row["matched gap 4"], row["recall 4"]) == (
        "28.20",
        "2.10",
        "0.40 ± 0.10",
        "+1.00",
    )
    assert (row["SSIM 4"], row["theme agr."], row["lighting agr."]) == ("0.500", "0.90", "0.50")


def _spellers(path: Path) -> list[str]:
    "Functions in `path` with a string or f-string beginning `ddim_` that is not the field name."
    out = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                head = node.values[0] if isinstance(node, ast.JoinedStr) and node.values else node
                text = getattr(head, "value", None) if isinstance(head, ast.Constant) else None
                if isinstance(text, str) and text.startswith("ddim_") and text != "ddim_steps":
                    out.append(f"{path.name}:{fn.name}")
                    break
    return out


def test_one_place_spells_and_parses_ddim_keys():
    """eval.json's `ddim_K` keys are spelled and parsed in `core/eval_result.py` alone (`_key`,
    `_by_steps`); the rest of the package and the tools read the file through the type."""
    files = [p for p in (ROOT / "qmind_render").rglob("*.py") if p.name != "_modidx.py"]
    files += sorted((ROOT / "tools").glob("*.py"))
    found = [f for p in files if p.name != "code_stats.py" for f in _spellers(p)]
    assert found == ["eval_result.py:_key", "eval_result.py:_by_steps"], found
    # the counter catches a speller (a known answer)
    assert _spellers(ROOT / "qmind_render" / "core" / "eval_result.py")
