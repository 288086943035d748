"""Run under `composer -n N` (or alone): the batches each rank reads from aspect-ratio buckets, as JSON: epoch 0
whole, then epoch 1 resumed after RESUME global batches (as a run resumed from a checkpoint there).

usage: bucket_order.py OUT GLOBAL_BATCH RESUME key=value ...   (data config keys)
Each batch is [image height, image width, sample ids...]; OUT.rank<R> gets {"epoch0": [...], "resumed": [...]}.
"""
import json
import sys

from composer.utils import dist

from models.common import build_config, parse_overrides
from train.config import DataConfig
from train.data.loader import make_dataset

out, global_batch, resume = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cfg = build_config(DataConfig, parse_overrides(sys.argv[4:]), prefix="data.")
world, rank = dist.get_world_size(), dist.get_global_rank()
batch = global_batch // world
dataset = make_dataset(cfg, batch, seed=7, with_ids=True)


def batches() -> list[list[int]]:
    samples = list(dataset)
    return [[*samples[i]["image"].shape[:2], *(s["sample_id"] for s in samples[i:i + batch])]
            for i in range(0, len(samples) - batch + 1, batch)]


epoch0 = batches()
dataset.load_state_dict({"epoch": 1, "sample_in_epoch": resume * global_batch, "num_canonical_nodes": 1,
                         "shuffle_seed": 7, "initial_physical_nodes": None})
with open(f"{out}.rank{rank}", "w") as f:
    json.dump({"epoch0": epoch0, "resumed": batches()}, f)
