"""Run under `composer -n N` (or alone): one checkpoint's validation figures, measured on every rank's shard
of the held-out split and summed over ranks, written by rank 0 as JSON.

    validation_ranks.py OUT.json CHECKPOINT HELD_OUT_MDS COMPONENTS
"""
import json
import sys


from composer.devices import DeviceCPU
from composer.utils import dist

from train.callbacks import read_held_out, validation_figures
from train.checkpoints import model_weights, read_checkpoint
from train.config import load_config
from train.trainer import build_model

out, checkpoint, held_out, components = sys.argv[1:5]
if dist.get_world_size() > 1:
    dist.initialize_dist(DeviceCPU())
cfg = load_config("configs/tiny-phase1.yaml", [f"model.pretrained={components}", "data.path=unused",
                                                 "global_train_batch_size=8", "device_train_microbatch_size=4"])
model = build_model(cfg)
weights = model_weights(read_checkpoint(checkpoint))
model.unet.load_state_dict({k[len("unet."):]: v for k, v in weights.items() if k.startswith("unet.")})
held = read_held_out(held_out, 16, 16, dist.get_global_rank(), dist.get_world_size())
figures = validation_figures(model, held, [100, 500, 900], 0, 3, "validation")
if dist.get_global_rank() == 0:
    with open(out, "w") as f:
        json.dump({"figures": figures, "shard": len(held.indices)}, f)
