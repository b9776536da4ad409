"""Integrity for what the data stage writes and later trusts: a sealed manifest (an edited one is
refused naming the fault, and rebuilt exactly by `qmind data repair`), a shard changed after
verification caught at the read, `data ls` that lists healthy datasets beside a broken one, and
repair that makes a bad shard again byte for byte (or says why not)."""

import dataclasses
import json
import os

import numpy as np
import pytest

from qmind_render.data.cache import RECIPE, fetch, seal_manifest, verify_dataset
from qmind_render.cli import main
from qmind_render.data.recipe import DataConfig
from qmind_render.contracts import load_spec
from qmind_render.data.dataset import (
    DatasetError,
    DatasetWriter,
    Grid,
    dataset_key,
    random_samples,
    read_manifest,
)
from qmind_render.data.generate import generate, repair_dataset
from qmind_render.data.loader import make_loader
from qmind_render.data.splits import make_split
from qmind_render.data.stores import open_store

SPEC, GRID = load_spec(), Grid.of()
MANIFEST = "manifest.json"


def write_dataset(store, ds="ds-t", shards=3, n=4, generator=None):
    w = DatasetWriter(store, ds)
    for i in range(shards):
        w.add_shard(i, random_samples(n, SPEC, GRID, np.random.default_rng(i)))
    return w.commit(seeds=(0, shards), generator=generator)


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(tmp_path / "store")
    return open_store(f"s3://{request.getfixturevalue('s3_bucket')}/p")


def edit_manifest(store, ds, fn):
    key = dataset_key(ds, MANIFEST)
    sealed = store.get_bytes(key)
    d = json.loads(sealed)
    fn(d)
    store.put_bytes(json.dumps(d).encode(), key)
    return sealed


def drop_middle(d):
    del d["shards"][1]


def swap(d):
    d["shards"][:2] = d["shards"][1::-1]


def empty(d):
    d["shards"] = {}


def n_as_text(d):
    d["shards"][1]["n"] = "4"


@pytest.mark.parametrize(
    "edit, says",
    [
        (drop_middle, "shard record 1 is 'shard-00002.npz', expected 'shard-00001.npz'"),
        (swap, "shard record 0 is 'shard-00001.npz', expected 'shard-00000.npz'"),
        (empty, r"manifest lists no shards \(shards: \{\}\)"),
        (n_as_text, "shard shard-00001.npz has n='4', expected a whole number > 0"),
    ],
)
def test_edited_manifest_is_refused_then_rebuilt_exactly(store, tmp_path, edit, says):
    write_dataset(store)
    sealed = edit_manifest(store, "ds-t", edit)
    for check in (
        lambda: verify_dataset(store, "ds-t"),
        lambda: fetch(store, "ds-t", tmp_path / "cache"),
    ):
        with pytest.raises(
            DatasetError,
            match=rf"^dataset ds-t: {says}.*: the manifest was edited .*qmind data repair ds-t",
        ):
            check()
    assert repair_dataset(store, "ds-t")[0].startswith("manifest.json: rebuilt")
    assert (
        store.get_bytes(dataset_key("ds-t", MANIFEST)) == sealed
        and verify_dataset(store, "ds-t") == []
    )


def test_a_resealed_looking_edit_is_caught_by_the_hash_and_not_rebuilt(tmp_path):
    store = open_store(tmp_path / "store")
    write_dataset(store)
    # shape fine, content changed
    edit_manifest(store, "ds-t", lambda d: d.update(seeds=[0, 9]))
    with pytest.raises(DatasetError, match="does not match its content hash"):
        verify_dataset(store, "ds-t")
    with pytest.raises(DatasetError, match="do not rebuild the manifest it records"):
        repair_dataset(store, "ds-t")


def test_cli_ls_lists_healthy_beside_broken_and_verify_is_one_line(tmp_path, capsys):
    store = open_store(tmp_path / "store")
    for ds in ("ds-a", "ds-b", "ds-c"):
        write_dataset(store, ds)
    edit_manifest(store, "ds-b", n_as_text)
    edit_manifest(store, "ds-c", empty)
    assert main(["data", "ls", "--store", store.uri]) == 0
    out = capsys.readouterr().out.splitlines()
    assert (
        len(out) == 3 and out[0].startswith("ds-a") and "12 samples" in out[0] and " id " in out[0]
    )
    assert out[1].startswith("ds-b") and "BROKEN: shard shard-00001.npz has n='4'" in out[1]
    assert out[2].startswith("ds-c") and "BROKEN: manifest lists no shards" in out[2]
    assert main(["data", "verify", "ds-b", "--store", store.uri]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "qmind data: error: dataset ds-b: shard shard-00001.npz has n='4'" in err
    )
    assert f"qmind data repair ds-b --store {store.uri}" in err


def test_shard_changed_after_verification_is_caught_at_the_read(tmp_path):
    store = open_store(tmp_path / "store")
    write_dataset(store, n=8)
    ds = fetch(store, "ds-t", tmp_path / "cache")
    loader = make_loader(ds, make_split("random_15", GRID), batch=4, window=1)
    p = ds.paths[1]
    good = p.read_bytes()
    # truncated after verification
    p.write_bytes(good[:-100])
    with pytest.raises(
        DatasetError,
        match=r"dataset ds-t, shard shard-00001.npz: size .* \(truncated or replaced\)",
    ):
        for _ in loader:
            pass
    in_worker = make_loader(ds, make_split("random_15", GRID), batch=4, window=1, workers=1)
    # raised again by the DataLoader: still one line
    with pytest.raises(DatasetError) as e:
        for _ in in_worker:
            pass
    assert (e.value.dataset, e.value.shard, "\n" in str(e.value)) == (
        "ds-t",
        "shard-00001.npz",
        False,
    )
    # the same size, mtime and inode (invisible to a stat): what the zip reader throws still names
    # the shard
    st = p.stat()
    # no end-of-central-directory
    with open(p, "r+b") as f:
        f.write(good)
        f.seek(-22, os.SEEK_END)
        f.write(bytes(22))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    # as fetch verified it, at the good size
    ds.stamps[1] = [st.st_size + 100, st.st_mtime_ns, st.st_ino]
    with pytest.raises(
        DatasetError, match=r"dataset ds-t, shard shard-00001.npz: unreadable .*BadZipFile"
    ):
        ds.read_shard(1)


def test_unsealed_manifest_is_refused_until_verify_seals_it(tmp_path, capsys):
    store = open_store(tmp_path / "store")
    write_dataset(store)
    # as written before manifests were sealed
    sealed = edit_manifest(store, "ds-t", lambda d: d.pop("content_sha256"))
    with pytest.raises(DatasetError, match=r"no content hash .*qmind data verify ds-t --seal"):
        fetch(store, "ds-t", tmp_path / "cache")
    assert main(["data", "verify", "ds-t", "--seal", "--store", store.uri]) == 0
    assert store.get_bytes(dataset_key("ds-t", MANIFEST)) == sealed and fetch(
        store, "ds-t", tmp_path / "cache"
    )


TINY = DataConfig(dataset="ds-r", seed_start=0, episodes=2, frames_per_episode=5, shard_size=5)


def flip(store, key):
    b = bytearray(store.get_bytes(key))
    b[len(b) // 2] ^= 0x01
    store.put_bytes(bytes(b), key)


def test_repair_makes_a_flipped_shard_again_byte_for_byte(store, tmp_path, capsys):
    generate(
        dataclasses.replace(TINY, store=store.uri),
        workers=1,
        cache=tmp_path / "gen",
        progress=False,
    )
    key = dataset_key("ds-r", "shard-00001.npz")
    good = store.get_bytes(key)
    flip(store, key)
    with pytest.raises(
        DatasetError,
        match=r"dataset ds-r, shard shard-00001.npz: .*corrupt.*qmind data repair ds-r --store "
        rf"{store.uri}",
    ):
        fetch(store, "ds-r", tmp_path / "cache")
    assert main(["data", "repair", "ds-r", "--store", store.uri]) == 0
    assert "shard-00001.npz: made again from the recipe" in capsys.readouterr().out
    assert store.get_bytes(key) == good and verify_dataset(store, "ds-r") == []
    assert fetch(store, "ds-r", tmp_path / "cache").read_shard(1)["seed"].tolist() == [1] * 5


def test_repair_refuses_what_it_cannot_make_again(tmp_path):
    store = open_store(tmp_path / "store")
    generate(dataclasses.replace(TINY, store=store.uri), workers=1, progress=False)
    recipe = read_manifest(store, "ds-r").generator
    assert set(RECIPE) <= set(recipe)
    cases = {
        "ds-none": (None, "no generation recipe"),
        "ds-old": ({**recipe, "engine": "0.0.1"}, r"made with engine 0.0.1 \(now .*new ID"),
        "ds-other": (
            recipe,
            "made again from the recipe it hashes to .*not the manifest's.*new ID",
        ),
    }
    for ds, (gen, says) in cases.items():
        # recipe's 2 x 5 samples, but other bytes
        write_dataset(store, ds, shards=2, n=5, generator=gen)
        flip(store, dataset_key(ds, "shard-00001.npz"))
        with pytest.raises(DatasetError, match=says):
            repair_dataset(store, ds)
    with pytest.raises(DatasetError, match=r"not sealed: 1 problem"):
        edit_manifest(store, "ds-none", lambda d: d.pop("content_sha256"))
        seal_manifest(store, "ds-none")


def test_a_random_themes_dataset_keeps_the_grids_frames_and_repairs_from_its_recipe(tmp_path):
    """`data.themes=grid+random:N`: the grid's episodes byte for byte as `grid` makes them, then
    the random themes' episodes, whose frames show no grid cell (training frames under every
    split); a corrupt random-theme shard is made again from the recipe."""
    store = open_store(str(tmp_path / "store"))
    base = dict(store=store.uri, episodes=5, frames_per_episode=8, shard_size=16)
    grid = generate(DataConfig(dataset="ds-g", **base), workers=1, progress=False)
    cfg = DataConfig(dataset="ds-r", themes="grid+random:2", **base)
    m = generate(cfg, workers=1, progress=False)
    assert m.generator["themes"] == "grid+random:2" and m.generator["random_episodes"] == 2
    assert m.seeds == [0, 7] and m.grid_seeds == (0, 5) and grid.grid_seeds == (0, 5)
    g, r = fetch(store, "ds-g", tmp_path / "c"), fetch(store, "ds-r", tmp_path / "c")
    n = g.manifest.n_samples
    for k in ("rgb", "theme", "lighting", "cells"):
        a = np.concatenate([g.read_shard(i, [k])[k] for i in range(len(g.paths))])
        b = np.concatenate([r.read_shard(i, [k])[k] for i in range(len(r.paths))])
        assert np.array_equal(a, b[:n]), k
    theme = np.concatenate([r.read_shard(i, ["theme"])["theme"] for i in range(len(r.paths))])
    assert set(theme[n:].tolist()) == {5, 6} and not r.cells[n:].any()
    last = r.paths[-1]
    data = bytearray(last.read_bytes())
    data[200] ^= 0xFF
    last.write_bytes(bytes(data))
    done = repair_dataset(store, "ds-r")
    assert any("made again from the recipe" in line for line in done), done
    verify_dataset(store, "ds-r")
