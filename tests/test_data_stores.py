"""Datasets in real stores: a local directory and S3 (moto_server on loopback), and every fault the
issue names: flipped byte, truncated or missing shard, incompatible manifest, unreachable store,
interrupted upload. Each is refused naming the dataset and the shard; nothing half-written is a
dataset."""

import json

import numpy as np
import pytest

from qmind_render.data.cache import fetch, verify_dataset
from qmind_render.contracts import load_spec
from qmind_render.data.dataset import (
    DatasetError,
    manifest_hash,
    DatasetExists,
    DatasetWriter,
    Grid,
    dataset_key,
    list_datasets,
    random_samples,
    read_manifest,
)
from qmind_render.data.stores import S3Store, StoreError, open_store

SPEC, GRID = load_spec(), Grid.of()


def write_dataset(store, ds="ds-t", shards=3, n=20, commit=True):
    w = DatasetWriter(store, ds)
    infos = [
        w.add_shard(i, random_samples(n, SPEC, GRID, np.random.default_rng(i)))
        for i in range(shards)
    ]
    return (w.commit(seeds=(0, shards)) if commit else None), infos


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(tmp_path / "store")
    bucket = request.getfixturevalue("s3_bucket")
    return open_store(f"s3://{bucket}/some/prefix")


def test_round_trip_through_cache(store, tmp_path):
    m, infos = write_dataset(store)
    assert list_datasets(store) == ["ds-t"]
    ds = fetch(store, "ds-t", tmp_path / "cache")
    assert ds.manifest == m and [p.name for p in ds.paths] == [i.file for i in infos]
    assert verify_dataset(store, "ds-t") == []
    again = fetch(store, "ds-t", tmp_path / "cache")  # second fetch: from cache, still verified
    assert again.paths == ds.paths


def test_existing_id_is_refused(store):
    write_dataset(store)
    with pytest.raises(DatasetExists, match="immutable"):
        DatasetWriter(store, "ds-t")


def test_interrupted_write_is_not_a_dataset(store):
    write_dataset(store, commit=False)  # shards uploaded, manifest never written
    assert list_datasets(store) == []
    with pytest.raises(DatasetError, match="ds-t.*no manifest"):
        read_manifest(store, "ds-t")
    # a rerun finishes it: same shards (same bytes), then the manifest
    m, _ = write_dataset(store)
    assert list_datasets(store) == ["ds-t"] and m.n_samples == 60


def _tamper(store, key, fn):
    data = store.get_bytes(key)
    if fn is None:
        if isinstance(store, S3Store):
            store.client.delete_object(Bucket=store.bucket, Key=store._k(key))
        else:
            store.local_path(key).unlink()
    else:
        store.put_bytes(fn(data), key)


def flip(b):
    b = bytearray(b)
    b[len(b) // 3] ^= 0x10
    return bytes(b)


def truncate(b):
    return b[: len(b) - 1000]


@pytest.mark.parametrize(
    "fault, expect", [(flip, "sha256"), (truncate, "truncated"), (None, "missing")]
)
def test_corrupt_shard_is_refused_naming_dataset_and_shard(store, tmp_path, fault, expect):
    write_dataset(store)
    _tamper(store, dataset_key("ds-t", "shard-00001.npz"), fault)
    with pytest.raises(DatasetError, match=rf"dataset ds-t, shard shard-00001.npz: .*{expect}"):
        fetch(store, "ds-t", tmp_path / "cache")
    problems = verify_dataset(store, "ds-t")
    assert len(problems) == 1 and "shard-00001.npz" in problems[0]


def test_corrupted_cache_copy_is_caught_at_the_read_and_fetched_again(tmp_path, s3_bucket):
    store = open_store(f"s3://{s3_bucket}/p")
    write_dataset(store)
    ds = fetch(store, "ds-t", tmp_path / "cache")
    p = ds.paths[2]
    good = p.read_bytes()
    p.write_bytes(flip(good))
    with pytest.raises(
        DatasetError, match=r"dataset ds-t, shard shard-00002.npz: sha256 .*corrupt"
    ):
        ds.read_shard(2)  # changed after fetch verified it
    # the store's copy is the truth: the bad copy is fetched again
    again = fetch(store, "ds-t", tmp_path / "cache")
    assert again.paths[2].read_bytes() == good and again.read_shard(2)["seed"].shape == (20,)


def test_incompatible_manifest_names_both_versions(store, tmp_path):
    write_dataset(store)
    key = dataset_key("ds-t", "manifest.json")
    m = json.loads(store.get_bytes(key))
    m["channel_spec"] = "0.2.0"
    # a genuine manifest from another spec version, not an edited one
    m["content_sha256"] = manifest_hash(m)
    store.put_bytes(json.dumps(m).encode(), key)
    with pytest.raises(DatasetError, match=r"ds-t.*0\.2\.0.*0\.1\.1"):
        fetch(store, "ds-t", tmp_path / "cache")


def test_malformed_manifest(store):
    write_dataset(store)
    store.put_bytes(b"{not json", dataset_key("ds-t", "manifest.json"))
    with pytest.raises(DatasetError, match="ds-t: manifest is not valid JSON"):
        read_manifest(store, "ds-t")


def test_unreachable_store_is_a_clear_error(monkeypatch):
    from tests.conftest import free_port

    # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    store = open_store("s3://nowhere/prefix")
    with pytest.raises(
        StoreError, match=r"s3://nowhere/prefix: .*datasets/ds-x/manifest.json.*reachable"
    ):
        read_manifest(store, "ds-x")


def test_large_shard_goes_multipart(s3_bucket, tmp_path):
    store = open_store(f"s3://{s3_bucket}/big")
    m, infos = write_dataset(store, shards=1, n=200)  # ~10.6 MB > 8 MB multipart threshold
    assert infos[0].bytes > 8 << 20
    head = store.client.head_object(
        Bucket=s3_bucket, Key=store._k(dataset_key("ds-t", infos[0].file))
    )
    assert "-" in head["ETag"]  # multipart ETags are "<md5 of part md5s>-<parts>"
    assert fetch(store, "ds-t", tmp_path / "cache").manifest.n_samples == 200


def test_missing_bucket_is_a_store_error(aws_env):
    store = open_store("s3://no-such-bucket-qmind/p")
    with pytest.raises(StoreError, match="no-such-bucket-qmind"):
        store.put_bytes(b"x", "k")
