"""Training on aspect-ratio buckets: every global batch from one bucket, on every rank, in one order through a kill
and a resume; buckets too small for a global batch left out, said once; the square path on the same folder.

The data: 43 PIL images of mixed shapes converted by `dwb data convert --aspect-buckets` at a budget of 32 px on a
step of 8, into its three buckets: 24x40 (12 images), 32x32 (12) and 40x24 (19).
"""
from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from train.config import DataConfig, load_config
from train.data import convert_to_mds
from train.data.loader import build_dataloader, make_dataset
from models.datasets.mds import open_local
from models.errors import WorkbenchError

from ..conftest import REPO, kill_once_saved, tiny_overrides
from ..ranks import run_ranks

# source sizes -> their bucket: (30, 60) covers 24x40 at 24x48 (crop_top 4), (48, 24) covers 40x24 at 48x24
# (crop_left 4)
SIZES = [(24, 40)] * 8 + [(30, 60)] * 4 + [(32, 32)] * 12 + [(40, 24)] * 13 + [(48, 24)] * 6
BUCKETS = {(24, 40): 12, (32, 32): 12, (40, 24): 19}
SCRIPT = REPO / "tests" / "train" / "bucket_order.py"
PHASE1 = REPO / "configs" / "tiny-phase1.yaml"


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory) -> Path:
    """The budget folder OUT/32 of the conversion."""
    tmp = tmp_path_factory.mktemp("buckets")
    (tmp / "src").mkdir()
    for i, (w, h) in enumerate(SIZES):
        pixels = np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp / "src" / f"{i:03d}.png")
        (tmp / "src" / f"{i:03d}.txt").write_text(f"a red circle {i}")
    summary = convert_to_mds(tmp / "src", tmp / "out", buckets=(32,), bucket_step=8, aspect_buckets=True,
                             image_format="png", workers=1, progress=False)
    assert summary.buckets == {f"32/{w}x{h}": n for (w, h), n in BUCKETS.items()}
    return tmp / "out" / "32"


def order_of(out: Path, global_batch: int, resume: int, keys: list[str], nproc: int) -> list[dict]:
    """``bucket_order.py``'s record of each rank: in this process for one rank, under Composer's launcher else."""
    if nproc == 1:
        argv = sys.argv
        sys.argv = [str(SCRIPT), str(out), str(global_batch), str(resume), *keys]
        try:
            runpy.run_path(str(SCRIPT), run_name="__main__")
        finally:
            sys.argv = argv
    else:
        run = run_ranks([str(SCRIPT), str(out), str(global_batch), str(resume), *keys], nproc)
        assert run.returncode == 0 and not run.hung, run.explain()
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(nproc)]


def global_batches(ranks: list[dict], part: str) -> list[tuple[tuple[int, int], list[int]]]:
    """Each global batch as (the shapes of its ranks' images, its sample ids sorted)."""
    out = []
    for k in range(len(ranks[0][part])):
        shapes = {tuple(r[part][k][:2]) for r in ranks}
        assert len(shapes) == 1, f"global batch {k} mixes buckets across ranks: {shapes}"
        out.append((shapes.pop(), sorted(i for r in ranks for i in r[part][k][2:])))
    return out


@pytest.mark.slow  # Composer's launcher and two ranks, each importing torch and Streaming
def test_every_global_batch_comes_from_one_bucket_on_two_ranks_in_one_order(bucketed, tmp_path):
    """8 a global batch: 1 + 1 + 2 full batches an epoch; the partial ones (4, 4 and 3 images) wait for the next
    epoch's shuffle. Two ranks read what one process reads, and a resume after 2 global batches reads the rest."""
    keys = [f"path={bucketed}", "resolution=32"]
    one = global_batches(order_of(tmp_path / "one", 8, 2, keys, 1), "epoch0")
    two = order_of(tmp_path / "two", 8, 2, keys, 2)
    assert global_batches(two, "epoch0") == one
    assert len(one) == sum(n // 8 for n in BUCKETS.values())
    offsets = np.cumsum([0, *BUCKETS.values()])
    for (h, w), ids in one:
        k = list(BUCKETS).index((w, h))  # the bucket's stream: its sample ids follow the buckets' order
        assert all(offsets[k] <= i < offsets[k + 1] for i in ids) and len(set(ids)) == 8
    one_again = order_of(tmp_path / "again", 8, 0, keys, 1)[0]  # the whole of epoch 1 in one process
    epoch1 = global_batches([one_again], "resumed")
    assert epoch1 != one  # another epoch, another order
    assert global_batches(two, "resumed") == epoch1[2:]


def test_buckets_smaller_than_a_global_batch_are_left_out_and_said_once(bucketed, capsys):
    dataset = make_dataset(DataConfig(path=str(bucketed), resolution=32), 16, seed=0, with_ids=True)
    line = capsys.readouterr().out.strip()
    assert line.count("\n") == 0 and "left out 24 images of 2 buckets" in line
    assert f"{bucketed} 24x40 12" in line and f"{bucketed} 32x32 12" in line and "40x24" not in line
    sizes = {dataset[i]["image"].shape[:2] for i in range(dataset.num_samples)}
    assert sizes == {(24, 40)}  # only the 40x24 bucket's images, at their stored size
    with pytest.raises(WorkbenchError, match="no aspect-ratio bucket .* one global batch of 32") as e:
        make_dataset(DataConfig(path=str(bucketed), resolution=32), 32, seed=0)
    assert "\n" not in str(e.value)


def test_the_resolution_must_be_the_buckets_budget(bucketed):
    with pytest.raises(WorkbenchError, match="budget 32 x 32 px, but data.resolution is 16") as e:
        make_dataset(DataConfig(path=str(bucketed), resolution=16), 8, seed=0)
    assert "\n" not in str(e.value)


def test_bucket_samples_are_stored_images_with_their_size_and_crop(bucketed, components):
    """Each image at its bucket's size, as stored; ``original_size`` the source's (height, width) and
    ``crop_top_left`` the conversion's centred crop of the source resized to cover the bucket."""
    from transformers import CLIPTokenizer

    from train.data.loader import TokenizingCollate

    dataset = make_dataset(DataConfig(path=str(bucketed), resolution=32), 4, seed=0)
    samples = [dataset[i] for i in range(dataset.num_samples)]
    for sample in samples:
        w, h = SIZES[int(sample["caption"].split()[-1])]
        bh, bw = sample["image"].shape[:2]
        scale = max(bw / w, bh / h)
        resized = (max(bw, round(w * scale)), max(bh, round(h * scale)))
        assert (bw, bh) in BUCKETS
        assert sample["original_size"] == (h, w)
        assert sample["crop_top_left"] == ((resized[1] - bh) // 2, (resized[0] - bw) // 2)
    assert {s["crop_top_left"] for s in samples} == {(0, 0), (4, 0), (0, 4)}  # the crops are not all nothing
    batch = TokenizingCollate(CLIPTokenizer.from_pretrained(components / "tokenizer"))(samples[:4])
    assert batch["original_size"].dtype == batch["crop_top_left"].dtype == torch.long
    assert batch["original_size"].tolist() == [list(s["original_size"]) for s in samples[:4]]
    assert batch["crop_top_left"].shape == (4, 2)


def test_the_square_path_reads_a_bucketed_folder_in_square_crops(bucketed, components):
    """``data.aspect_buckets: false``: every image cropped square at data.resolution, its crop's top-left in the
    source resized so its shorter side is 32 (to the pixel: the stored crop was made at another scale)."""
    from transformers import CLIPTokenizer

    cfg = DataConfig(path=str(bucketed), resolution=32, aspect_buckets=False, shuffle=False)
    loader = build_dataloader(cfg, CLIPTokenizer.from_pretrained(components / "tokenizer"), 43, seed=0,
                              drop_last=False)
    (batch,) = list(loader)
    assert batch["image"].shape == (43, 3, 32, 32)
    captions = [s["caption"] for s in (open_local(bucketed)[i] for i in range(43))]
    for caption, size, crop in zip(captions, batch["original_size"].tolist(), batch["crop_top_left"].tolist()):
        w, h = SIZES[int(caption.split()[-1])]
        assert size == [h, w]
        resized = (round(w * 32 / min(w, h)), round(h * 32 / min(w, h)))
        assert abs(crop[0] - (resized[1] - 32) // 2) <= 1 and abs(crop[1] - (resized[0] - 32) // 2) <= 1


def run_overrides(bucketed: Path, components: Path, folder: Path) -> list[str]:
    """6 batches of 8 (an epoch is 4), a checkpoint every 2, EMA, each sample's draws its own."""
    return tiny_overrides(bucketed.parent, components, folder, res=32, max_duration="6ba", save_interval="2ba",
                          autoresume="true", randomness="per_sample", run_name="buckets", preview_interval="null",
                          **{"data.path": bucketed, "ema.enabled": "true"})


@pytest.fixture
def batches_seen(monkeypatch) -> list[tuple]:
    """(epoch, image height and width, sample ids) of every batch the model trains on in this process."""
    from train.recipes import LatentDiffusion

    seen, forward = [], LatentDiffusion.forward

    def recorded(self, batch):
        seen.append((int(batch["epoch"][0]), *batch["image"].shape[2:], batch["sample_id"].tolist()))
        return forward(self, batch)

    monkeypatch.setattr(LatentDiffusion, "forward", recorded)
    return seen


@pytest.mark.slow  # a `dwb train` process killed, beside two runs in this one
def test_a_run_killed_and_autoresumed_sees_the_same_batches_and_ends_bit_identical(bucketed, components, tmp_path,
                                                                                  batches_seen):
    from train.trainer import build_trainer, train

    from .test_resilience import differing

    reference = tmp_path / "reference"
    train(load_config(PHASE1, run_overrides(bucketed, components, reference)))
    uninterrupted = list(batches_seen)
    assert len(uninterrupted) == 6
    assert len({(h, w) for _, h, w, _ in uninterrupted}) > 1  # batches of more than one bucket

    killed = tmp_path / "killed"
    proc = subprocess.Popen([str(Path(sys.executable).parent / "dwb"), "train", str(PHASE1),
                             *run_overrides(bucketed, components, killed)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    kill_once_saved(proc, killed / "ep0-ba2-rank0.pt")
    batches_seen.clear()
    trainer = build_trainer(load_config(PHASE1, run_overrides(bucketed, components, killed)))
    start = int(trainer.state.timestamp.batch)
    trainer.fit()
    trainer.close()

    assert start in (2, 4) and batches_seen == uninterrupted[start:]
    assert differing(killed / "ep1-ba6-rank0.pt", reference / "ep1-ba6-rank0.pt") == []


def test_an_image_not_of_its_buckets_size_is_one_line_naming_it(tmp_path):
    """A bucket folder made by hand (here with Streaming's own writer and merge) whose images are not its size."""
    from train.data.convert import _merge_into
    from models.datasets.mds import open_writer

    budget = tmp_path / "32"
    with open_writer(budget / "40x24" / "0", "png", aspect=True) as writer:
        for i in range(8):
            writer.write({"image": Image.new("RGB", (32, 32)), "caption": f"a red circle {i}", "meta": {},
                          "original_width": 32, "original_height": 32, "crop_top": 0, "crop_left": 0,
                          "bucket_width": 40, "bucket_height": 24})
    _merge_into(budget / "40x24", [budget / "40x24" / "0"])
    _merge_into(budget, [budget / "40x24"])
    dataset = make_dataset(DataConfig(path=str(budget), resolution=32), 8, seed=0)
    with pytest.raises(WorkbenchError, match=r"40x24: sample \d .* is 32x32 px, not its bucket's 40x24") as e:
        dataset[0]
    assert "\n" not in str(e.value)


def test_precomputing_a_bucketed_folder_is_refused_in_one_line(bucketed, components):
    from train.data import precompute_latents

    for src, sides in ((bucketed.parent, None), (bucketed, [32])):
        with pytest.raises(WorkbenchError, match="holds aspect-ratio buckets") as e:
            precompute_latents(str(src), "unused", vae_ref=str(components), text_encoder_ref=str(components),
                               resolutions=sides, progress=False)
        assert "\n" not in str(e.value)


def test_a_remote_budget_folder_trains_on_its_buckets(s3_server, bucketed, tmp_path):
    from ..conftest import upload_folder

    remote = upload_folder(bucketed, "data", "buckets/32")
    dataset = make_dataset(DataConfig(path=str(tmp_path / "cache"), remote=remote, resolution=32), 8, seed=0)
    assert dataset.bucket_sizes == list(BUCKETS) and [s.remote for s in dataset.streams] == [
        f"{remote}/{w}x{h}" for w, h in BUCKETS]
    firsts = [dataset[int(i)]["image"].shape[:2] for i in dataset.sample_offset_per_stream]  # each bucket's first
    assert firsts == [(h, w) for w, h in BUCKETS]


def test_a_second_open_after_another_process_took_the_shared_memory_name_reads_the_buckets(bucketed, monkeypatch):
    """Streaming picks a free shared-memory name and then creates it; a process that took it first makes the open
    fail with FileExistsError after the streams were weighed, and the loader opens again (two ranks of one node
    did: "Streams must provide at most one of `proportion`, `repeat`, or `choose`")."""
    from streaming import StreamingDataset

    real, calls = StreamingDataset.__init__, []

    def taken_once(self, *args, **kwargs):
        calls.append(1)
        real(self, *args, **kwargs)
        if len(calls) == 1:
            raise FileExistsError("/dev/shm name taken by another process")

    monkeypatch.setattr(StreamingDataset, "__init__", taken_once)
    dataset = make_dataset(DataConfig(path=str(bucketed), resolution=32), 4, seed=0)
    assert len(calls) == 2 and len(dataset.streams) == len(dataset.bucket_sizes) > 1
