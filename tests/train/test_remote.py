"""Datasets and checkpoints on S3-compatible storage (a moto server on 127.0.0.1)."""
import boto3
import pytest
import torch

from models.checkpoints import model_weights, read_checkpoint
from train.config import load_config
from models.errors import WorkbenchError
from train.trainer import build_trainer, train

from ..conftest import REPO, tiny_overrides, upload_folder

PHASE1 = REPO / "configs/tiny-phase1.yaml"


def _objects(bucket: str, prefix: str) -> list[str]:
    import os

    s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]


def test_training_streams_a_remote_dataset_into_a_local_cache(s3_server, shapes_data, components, tmp_path):
    remote = upload_folder(shapes_data / "16", "data", "shapes/16")
    cache = tmp_path / "cache"
    over = tiny_overrides(shapes_data, components, tmp_path / "ckpt", max_duration="2ba", save_interval="2ba")
    train(load_config(PHASE1, over + [f"data.remote={remote}", f"data.path={cache}"]))
    assert (tmp_path / "ckpt" / "ep0-ba2-rank0.pt").is_file()
    assert (cache / "index.json").is_file() and list(cache.glob("shard.*.mds"))  # shards came from the store


def test_remote_precomputed_latents(s3_server, shapes_data, components, tmp_path):
    from train.data.precompute import precompute_latents

    precompute_latents(str(shapes_data), str(tmp_path / "lat"), vae_ref=str(components), text_encoder_ref=str(components),
               resolutions=[16], chunk_size=100, progress=False)
    remote = upload_folder(tmp_path / "lat" / "16", "data", "latents/16")
    over = tiny_overrides(shapes_data, components, tmp_path / "ckpt", max_duration="2ba", save_interval="2ba")
    train(load_config(PHASE1, over + [f"data.remote={remote}", f"data.path={tmp_path / 'cache'}", "data.precomputed=true"]))
    assert (tmp_path / "ckpt" / "ep0-ba2-rank0.pt").is_file()


def test_checkpoints_saved_to_s3_and_autoresumed_from_it(s3_server, shapes_data, components, tiny_run, tmp_path,
                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)  # Composer stages remote checkpoints in a local folder
    remote = "s3://runs/remote-run/checkpoints"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket="runs")
    over = tiny_overrides(shapes_data, components, remote, save_interval="2ba", autoresume="true", run_name="remote-run")
    train(load_config(PHASE1, over + ["max_duration=2ba"]))
    assert "remote-run/checkpoints/ep0-ba2-rank0.pt" in _objects("runs", "remote-run/")

    trainer = build_trainer(load_config(PHASE1, over + ["max_duration=4ba"]))
    assert int(trainer.state.timestamp.batch) == 2  # resumed from the object store
    trainer.fit()
    trainer.close()
    assert "remote-run/checkpoints/ep0-ba4-rank0.pt" in _objects("runs", "remote-run/")

    # The resumed run ends where the suite's uninterrupted local run of the same 4 batches ends, bit for bit.
    fetched = tmp_path / "fetched.pt"
    boto3.client("s3", endpoint_url=s3_server).download_file("runs", "remote-run/checkpoints/ep0-ba4-rank0.pt", str(fetched))
    a, b = model_weights(read_checkpoint(fetched)), model_weights(read_checkpoint(tiny_run / "ep0-ba4-rank0.pt"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_remote_without_credentials_is_one_clear_error(s3_server, shapes_data, components, tmp_path, monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    over = tiny_overrides(shapes_data, components, tmp_path / "ckpt", max_duration="2ba")
    with pytest.raises(WorkbenchError, match="'data.remote': s3://data/x needs S3 credentials"):
        build_trainer(load_config(PHASE1, over + ["data.remote=s3://data/x", f"data.path={tmp_path / 'c'}"]))
    with pytest.raises(WorkbenchError, match="'save_folder': s3://runs/y needs S3 credentials"):
        build_trainer(load_config(PHASE1, tiny_overrides(shapes_data, components, "s3://runs/y", max_duration="2ba")))


def test_a_missing_remote_dataset_is_one_clear_error(s3_server, shapes_data, components, tmp_path):
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket="empty")
    over = tiny_overrides(shapes_data, components, tmp_path / "ckpt", max_duration="2ba")
    with pytest.raises(WorkbenchError, match="cannot open the training data"):
        build_trainer(load_config(PHASE1, over + ["data.remote=s3://empty/nothing", f"data.path={tmp_path / 'c'}"]))


def test_precompute_reads_a_remote_source(s3_server, shapes_data, components, tmp_path):
    from streaming import LocalDataset  # no shared memory to race another test process for

    from train.data.precompute import precompute_latents

    remote = upload_folder(shapes_data / "16", "data", "precompute-src/16")
    kw = dict(vae_ref=str(components), text_encoder_ref=str(components), resolutions=[16], chunk_size=100, progress=False)
    precompute_latents(remote, str(tmp_path / "remote-src"), cache=str(tmp_path / "cache"), **kw)
    precompute_latents(str(shapes_data), str(tmp_path / "local-src"), **kw)
    a = LocalDataset(local=str(tmp_path / "remote-src" / "16"))
    b = LocalDataset(local=str(tmp_path / "local-src" / "16"))
    assert len(a) == len(b) == 192
    assert all(a[i]["latent_mean"].tobytes() == b[i]["latent_mean"].tobytes() for i in range(0, 192, 7))
