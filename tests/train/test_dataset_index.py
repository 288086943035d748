"""A local MDS dataset's index is checked against its shards before any sample is read, wherever a dataset is
opened (training, precompute, the tiny components, the shapes scorer, evaluate's reference set); a remote
dataset's read failures are one line naming it. The lying datasets are edited copies of one Streaming wrote."""
import json
import shutil

import pytest
from torch.utils.data import DataLoader

from train.config import DataConfig
from train.data.loader import make_dataset
from models.errors import WorkbenchError

from ..conftest import REPO, tiny_overrides, upload_folder

SHARD = "shard.00000.mds"


def _copy(shapes_data, root):
    """A copy of the 16 px bucket as ``root/16`` (the layout precompute and prepare read)."""
    shutil.copytree(shapes_data / "16", root / "16")
    return root / "16"


def _edit_index(folder, change):
    index = json.loads((folder / "index.json").read_text())
    change(index["shards"][0])
    (folder / "index.json").write_text(json.dumps(index))


@pytest.fixture(scope="module")
def lying(shapes_data, tmp_path_factory):
    """name -> (bucket folder, what the refusal must say besides the folder and the shard)."""
    root = tmp_path_factory.mktemp("lying")
    inflated = _copy(shapes_data, root / "inflated")
    _edit_index(inflated, lambda shard: shard.update(samples=shard["samples"] * 1000))
    deleted = _copy(shapes_data, root / "deleted")
    (deleted / SHARD).unlink()
    cut = _copy(shapes_data, root / "cut")
    full = (cut / SHARD).stat().st_size
    with open(cut / SHARD, "r+b") as f:
        f.truncate(full // 2)
    escaped = _copy(shapes_data, root / "escaped")  # a shard named by a path out of the dataset folder
    _edit_index(escaped, lambda shard: shard["raw_data"].update(basename=f"../../inflated/16/{SHARD}"))
    return {"inflated": (inflated, f"{SHARD} holds 192 samples, but index.json says 192000"),
            "deleted": (deleted, f"{SHARD} is missing"), "cut": (cut, f"{SHARD} is {full // 2} bytes, but index.json says {full}"),
            "escaped": (escaped, f"../../inflated/16/{SHARD} lies outside the dataset folder")}


def _refusal(call) -> str:
    with pytest.raises(WorkbenchError) as refused:
        call()
    message = str(refused.value)
    assert "\n" not in message
    return message


def _readers(components):
    from evaluate.reference import count_images, iter_images
    from train.data.precompute import precompute_latents
    from train.shapes.prepare import read_bucket
    from models.shapes.scorer import load_split

    return {
        "training": lambda folder: make_dataset(DataConfig(path=str(folder), resolution=16), 8, 0),
        "precompute": lambda folder: precompute_latents(str(folder.parent), str(folder.parent / "latents"),
                                                vae_ref=str(components), text_encoder_ref=str(components),
                                                progress=False),
        "prepare": lambda folder: read_bucket(folder, 16, 8),
        "scorer": lambda folder: load_split(folder),
        "evaluate reference count": lambda folder: count_images(folder),
        "evaluate reference images": lambda folder: next(iter_images(folder, 16)),
    }


@pytest.mark.parametrize("lie", ["inflated", "deleted", "cut", "escaped"])
def test_every_reader_refuses_a_lying_index_naming_folder_and_shard(lie, lying, components):
    folder, says = lying[lie]
    for reader, read in _readers(components).items():
        message = _refusal(lambda: read(folder))
        assert f"MDS dataset {folder}: shard {says}" in message, (reader, message)
    assert not (folder.parent / "latents").exists()  # precompute stopped before writing


def test_dwb_train_on_a_lying_index_is_one_line_and_writes_nothing(lying, shapes_data, components, tmp_path, dwb):
    for lie in ("inflated", "deleted"):
        folder, says = lying[lie]
        save = tmp_path / lie / "checkpoints"
        over = tiny_overrides(shapes_data, components, save, max_duration="2ba", save_interval="1ba")
        r = dwb("train", str(REPO / "configs/tiny-phase1.yaml"), *over, f"data.path={folder}")
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
        assert r.stderr.startswith(f"error: config key 'data.path': MDS dataset {folder}: shard {says}")
        assert not list(save.glob("*.pt"))


def test_a_true_index_still_opens_everywhere(shapes_data, components, tmp_path):
    folder = _copy(shapes_data, tmp_path)
    readers = _readers(components)
    assert len(readers["training"](folder)) == 192 and readers["evaluate reference count"](folder) == 192
    assert readers["prepare"](folder)[0].shape == (8, 3, 16, 16)


def test_a_shard_gone_from_a_remote_is_one_line_naming_the_remote(s3_server, shapes_data, tmp_path, caplog):
    import os

    import boto3

    remote = upload_folder(shapes_data / "16", "data", "lying/16")
    boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"]).delete_object(Bucket="data", Key=f"lying/16/{SHARD}")
    for workers in (0, 1):  # read in this process, and in a DataLoader worker (which re-raises with its traceback)
        dataset = make_dataset(DataConfig(path=str(tmp_path / f"cache{workers}"), remote=remote, resolution=16), 8, 0)
        message = _refusal(lambda: sum(1 for _ in DataLoader(dataset, batch_size=8, num_workers=workers)))
        assert message.startswith(f"cannot read the training data ({remote}): ") and SHARD in message
    assert "exception calling callback" not in caplog.text  # the thread's traceback is not logged
