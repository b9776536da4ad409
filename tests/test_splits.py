"""Splits with train, validation and test cells: draws reproduce byte for byte, the committed
files keep the held-out cells their models were trained without, novelty is what a hand count
says, and the novelty and leave-one-theme-out schemes hold out what they promise."""

from pathlib import Path

import numpy as np
import pytest

from qmind_render.data.dataset import Grid
from qmind_render.data.splits import (
    EXTRAPOLATION,
    NOVELTY_NAMES,
    LeakError,
    Split,
    SplitName,
    apply_split,
    assert_no_leak,
    load_split,
    make_split,
    novelty,
    novelty_counts,
    save_split,
    seeded_name,
)

ROOT = Path(__file__).resolve().parents[1]
G = Grid(5, 5, 4)
SCHEMES = ["random_15", "balanced_20", "coverage_50", "novelty0_75", "novelty1_75"]
SCHEMES += ["novelty2_75", "novelty3_50", "theme_2", "nested_50"]

# The held-out cells (grid indices) of the committed split files before they had validation
# cells (version 1, commit 1cc55dd): the committed models were trained without exactly these.
OLD_HELD_OUT = {
    "balanced_20": [0, 7, 9, 18, 23, 30, 33, 36, 45, 48, 54, 59, 61, 66, 71, 72, 82, 84, 95, 97],
    "coverage_25": [0, 1, 2, 3, 4, 5, 6, 8, 9, 11, 12, 13, 14, 15, 17, 18, 19, 20, 21, 22, 23, 24,
                    25, 26, 27, 29, 33, 34, 35, 36, 37, 38, 40, 41, 42, 43, 46, 47, 49, 50, 51, 52,
                    53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 69, 70, 72, 73, 74, 75, 77,
                    78, 79, 81, 82, 85, 87, 88, 91, 92, 94, 96, 97, 99],
    "coverage_50": [0, 3, 8, 9, 11, 12, 15, 19, 20, 22, 24, 25, 27, 32, 33, 36, 37, 38, 41, 43, 44,
                    45, 46, 47, 49, 51, 52, 54, 55, 56, 58, 59, 61, 64, 65, 67, 69, 70, 72, 75, 76,
                    79, 80, 85, 86, 88, 90, 94, 95, 98],
    "coverage_75": [0, 11, 12, 17, 18, 20, 26, 27, 28, 32, 35, 37, 40, 43, 47, 49, 60, 62, 63, 67,
                    69, 76, 78, 80, 85],
    "random_15": [12, 13, 20, 30, 36, 40, 45, 53, 56, 67, 70, 71, 76, 90, 95],
}  # fmt: skip


def written(split: Split, root: Path) -> bytes:
    return save_split(split, root).read_bytes()


@pytest.mark.parametrize("name", SCHEMES)
def test_a_seed_reproduces_the_file_byte_for_byte_and_another_seed_differs(name, tmp_path):
    a, b = make_split(name, G, seed=3), make_split(name, G, seed=3)
    assert written(a, tmp_path / "a") == written(b, tmp_path / "b")
    assert a.name == f"{name}-s3" and make_split(f"{name}-s3", G) == a
    other = make_split(name, G, seed=4)
    assert (other.validation, other.test) != (a.validation, a.test)
    if not name.startswith("theme"):  # leave-one-theme-out holds out the same theme every draw
        assert other.held_out != a.held_out


@pytest.mark.parametrize("name", sorted(OLD_HELD_OUT))
def test_the_committed_files_keep_their_held_out_cells_as_validation_and_test(name):
    s = load_split(name, ROOT)
    assert s.version == 2 and s.has_validation
    assert [G.index(*c) for c in s.held_out] == OLD_HELD_OUT[name]
    assert not set(s.validation) & set(s.test)
    assert 2 * len(s.validation) <= len(s.held_out)  # validation: half of each level, rounded down
    # and `qmind data split NAME` draws that file again
    assert make_split(name, G) == s


def test_the_committed_files_are_what_save_split_writes(tmp_path):
    for name in OLD_HELD_OUT:
        path = ROOT / "sweeps" / "splits" / f"{name}.yaml"
        assert written(make_split(name, G), tmp_path) == path.read_bytes(), name


def test_a_version_1_file_reads_as_all_test_cells(tmp_path):
    p = tmp_path / "old.yaml"
    p.write_text("name: old\ngrid: {theme: 5, material: 5, light: 4}\nheld_out: [[1, 1, 1]]\n")
    s = load_split(str(p))
    assert (s.version, s.validation, s.test, s.has_validation) == (1, (), ((1, 1, 1),), False)
    assert s.mask("validation").sum() == 0 and s.mask("test").sum() == 1
    assert written(s, tmp_path).count(b"held_out") == 1  # written back as it was


def lines(*cells):
    "Every cell matching any of `cells`, None standing for every level of that factor."
    return sorted(
        {
            (t, m, l)
            for c in cells
            for t in ([c[0]] if c[0] is not None else range(G.theme))
            for m in ([c[1]] if c[1] is not None else range(G.material))
            for l in ([c[2]] if c[2] is not None else range(G.light))
        }
    )


@pytest.mark.parametrize(
    "held, want",
    [
        ([(3, 2, 1)], {(3, 2, 1): 0}),
        (lines((0, 0, None)), {(0, 0, l): 1 for l in range(4)}),
        (lines((0, 0, None), (0, None, 0)), {**{c: 1 for c in lines((0, 0, None), (0, None, 0))},
                                             (0, 0, 0): 2}),
        (lines((0, 0, None), (0, None, 0), (None, 0, 0)),
         {**{c: 1 for c in lines((0, 0, None), (0, None, 0), (None, 0, 0))}, (0, 0, 0): 3}),
        (lines((None, 4, None)), {c: EXTRAPOLATION for c in lines((None, 4, None))}),
        # two parallel lines (castle brick, castle tile) leave every other pair seen
        (lines((0, 0, None), (0, 1, None)), {c: 1 for c in lines((0, 0, None), (0, 1, None))}),
    ],
)  # fmt: skip
def test_novelty_is_what_a_hand_count_says(held, want):
    s = Split("hand", G, (), held)
    nov = novelty(s)
    assert {c: int(nov[G.index(*c)]) for c in s.held_out} == want
    assert (nov[~s.mask()] == -1).all()
    assert set(NOVELTY_NAMES) == {0, 1, 2, 3, EXTRAPOLATION}


@pytest.mark.parametrize("level", [0, 1, 2, 3])
@pytest.mark.parametrize("share, seed", [(75, 0), (50, 0), (75, 1), (60, 5)])
def test_novelty_splits_test_their_level_and_train_every_level(level, share, seed):
    s = make_split(f"novelty{level}_{share}", G, seed=seed)
    nov = novelty(s)
    assert level in novelty_counts(s, "test") and nov.max() == level
    if level == 1:  # lines that never cross: every held-out cell is novelty 1
        assert novelty_counts(s) == {1: len(s.held_out)}
    train = np.array(s.cells("train"))
    assert [len(set(train[:, f])) for f in range(3)] == [5, 5, 4]
    # as near the share as the units allow: within one unit (a star holds 12 cells)
    k = 100 - share
    assert k - (1 if level == 0 else 12) < len(s.held_out) <= k
    # validation holds half of each level, rounded down; test the rest
    for v, n in novelty_counts(s).items():
        assert novelty_counts(s, "validation").get(v, 0) == n // 2


@pytest.mark.parametrize("theme, t", [("castle", 0), ("2", 2), ("neon", 4)])
def test_theme_t_holds_out_exactly_that_theme(theme, t):
    s = make_split(f"theme_{theme}", G)
    assert s.held_out == tuple(c for c in map(G.cell, range(100)) if c[0] == t)
    assert (len(s.validation), len(s.test)) == (10, 10)
    val = np.array(s.validation)
    assert np.bincount(val[:, 1], minlength=5).tolist() == [2] * 5  # 2 of each material's 4
    assert sorted(np.bincount(val[:, 2], minlength=4).tolist()) == [2, 2, 3, 3]
    assert novelty_counts(s) == {EXTRAPOLATION: 20}


@pytest.mark.parametrize(
    "name, said",
    [
        ("half", "unknown split scheme 'half'"),
        ("novelty4_75", "novelty{N}_P"),
        ("coverage_75-s", "-s{S}"),
        ("theme_atlantis", "no such theme; use an index 0..4 or a name (castle, lab"),
        ("theme_7", "no such theme"),
        ("novelty3_95", "needs at least 12 held-out cells, not 5"),
        ("coverage_100", "would hold out 0 of 100 cells"),
    ],
)
def test_a_bad_name_is_one_line_naming_the_grammar(name, said):
    with pytest.raises(ValueError, match=None) as e:
        make_split(name, G)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_seeded_names():
    assert seeded_name("coverage_75", 2) == "coverage_75-s2"
    assert seeded_name("coverage_75", 0) == "coverage_75"
    assert seeded_name("coverage_75-s2", 2) == seeded_name("coverage_75-s2") == "coverage_75-s2"
    with pytest.raises(ValueError, match="seed 3 contradicts"):
        seeded_name("coverage_75-s2", 3)
    assert SplitName.parse("novelty2_50-s7") == SplitName("novelty", "50", 2, 7)


def test_apply_split_gives_validation_and_test_frames_and_the_leak_check_holds():
    s = make_split("balanced_20", G)
    v, t, train = (G.index(*s.validation[0]), G.index(*s.test[0]), G.index(*s.cells("train")[0]))
    cells = np.zeros((5, 100), bool)
    for row, shown in enumerate([[v], [t], [v, t], [v, train], [train]]):
        cells[row, shown] = True
    parts = {k: x.tolist() for k, x in apply_split(cells, s).items()}
    assert parts == {
        "train": [4],
        "heldout": [0, 1, 2],
        "validation": [0],
        "test": [1],
        "dropped": [3],
    }
    for row in (0, 1, 3):  # a validation cell, a test cell, either beside a training cell
        with pytest.raises(LeakError, match="sample 0 shows held-out cell"):
            assert_no_leak(cells[[row]], s)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_nested_draws_nest_for_one_seed_and_keep_every_level(seed):
    train = [set(make_split(f"nested_{p}", G, seed=seed).cells("train")) for p in (10, 25, 50, 75)]
    assert train[0] < train[1] < train[2] < train[3]
    assert [len(t) for t in train] == [10, 25, 50, 75]
    t = np.array(sorted(train[0]))
    assert [len(set(t[:, f])) for f in range(3)] == [5, 5, 4]
