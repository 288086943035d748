"""Run under `composer -n N` (or alone): the sample ids each rank reads, per batch, as JSON.

usage: sample_order.py OUT.json BATCHES GLOBAL_BATCH key=value ...   (data config keys)
"""
import json
import sys

from composer.utils import dist

from train.config import DataConfig
from models.common import build_config, parse_overrides
from train.data.loader import make_dataset

out, batches, global_batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cfg = build_config(DataConfig, parse_overrides(sys.argv[4:]), prefix="data.")
world, rank = dist.get_world_size(), dist.get_global_rank()
dataset = make_dataset(cfg, global_batch // world, seed=7, with_ids=True)
ids = [sample["sample_id"] for _, sample in zip(range(batches * global_batch // world), dataset)]
per_batch = [ids[i:i + global_batch // world] for i in range(0, len(ids), global_batch // world)]
with open(f"{out}.rank{rank}", "w") as f:
    json.dump(per_batch, f)
