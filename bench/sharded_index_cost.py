"""What reading a sharded checkpoint's index costs: PyTorch's own reader (a bare ``pickle.load``, which lets the file
reach any object) against ``models.readers``' reader (records built and nothing else, objects counted), on an index
a real ``torch.distributed.checkpoint.save`` writes and on one laid out as an FSDP save on many ranks writes it.

    .venv/bin/python bench/sharded_index_cost.py [--smoke]    # writes bench/out/sharded_index_cost.json

CPU seconds of each read, each in a fresh process; the ratio is ours over pickle's.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from _common import ROOT, parse_args, report

READ = """
import io, pickle, sys, time
import torch.distributed.checkpoint.metadata, torch.distributed.checkpoint.filesystem  # what pickle.load imports
from models.readers.sharded_index import load_index
data = open(sys.argv[2], "rb").read()
start = time.process_time()
meta = pickle.load(io.BytesIO(data)) if sys.argv[1] == "pickle" else load_index(data, 1 << 40)
seconds = time.process_time() - start
print(seconds, len(meta.storage_data))
"""


def real_save(folder: Path, weights: int) -> Path:
    """A ``dcp.save`` of ``weights`` tensors with AdamW's two moments each, as one process writes it."""
    import torch
    import torch.distributed.checkpoint as dcp

    model = {f"layer{i}.weight": torch.zeros(4, 4) for i in range(weights)}
    state = {"state": {"model": model, "optimizers": {"AdamW": {"state": {
        name: {"exp_avg": torch.zeros(4, 4), "exp_avg_sq": torch.zeros(4, 4)} for name in model}}},
        "timestamp": {"batch": 10}}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder)))
    return folder / ".metadata"


def many_ranks(folder: Path, tensors: int, ranks: int) -> Path:
    """An index laid out as an FSDP save on ``ranks`` ranks writes it: every tensor in one chunk per rank."""
    import pickle

    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, MetadataIndex, TensorProperties,
                                                       TensorStorageMetadata)

    tensors_md, storage, planner = {}, {}, {}
    for t in range(tensors):
        fqn = f"state.model.unet.down_blocks.{t}.attentions.0.transformer_blocks.0.attn1.to_q.weight"
        chunks = [ChunkStorageMetadata(torch.Size([r * 8, 0]), torch.Size([8, 8])) for r in range(ranks)]
        tensors_md[fqn] = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([8 * ranks, 8]), chunks)
        planner[fqn] = tuple(fqn.split("."))
        for r in range(ranks):
            storage[MetadataIndex(fqn, torch.Size([r * 8, 0]))] = _StorageInfo(f"__{r}_0.distcp", t * 256, 256)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".metadata").write_bytes(pickle.dumps(Metadata(tensors_md, planner, storage)))
    return folder / ".metadata"


def read(reader: str, index: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", READ, reader, str(index)], cwd=ROOT, capture_output=True, text=True,
                          check=True)
    seconds, entries = done.stdout.split()
    return {"cpu_s": round(float(seconds), 3), "entries": int(entries)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", type=int, default=3000, help="weights of the real save")
    parser.add_argument("--tensors", type=int, default=2000, help="tensors of the 128-rank layout")
    args = parse_args(parser, {"weights": 60, "tensors": 20})
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(f"dcp.save, {args.weights:,} weights + AdamW", real_save(Path(tmp) / "real", args.weights)),
                 (f"FSDP layout, {args.tensors:,} tensors on 128 ranks", many_ranks(Path(tmp) / "ranks", args.tensors, 128))]
        for name, index in cases:
            pickle_row, ours = read("pickle", index), read("ours", index)
            assert pickle_row["entries"] == ours["entries"]
            rows.append({"index": name, "mib": round(index.stat().st_size / 2**20, 2), "pickle": pickle_row,
                         "ours": ours, "cpu_ratio": round(ours["cpu_s"] / max(pickle_row["cpu_s"], 1e-3), 2)})
    report("sharded_index_cost", {"rows": rows})


if __name__ == "__main__":
    main()
