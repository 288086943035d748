"""`dwb export` of full-size SD2-base (random weights) to one original-layout .safetensors, float32 and --half,
beside the diffusers-folder export of the same checkpoint, each in its own process, one after another.

Per export: wall time, peak resident memory (``/usr/bin/time -v``'s maximum RSS: it counts the pages of the
memory-mapped checkpoint the export has read, which the kernel can drop, as well as its own) and the size of
what it wrote (a single file's: the .safetensors alone; its .yaml and .config/ are a few MB). Afterwards, a sample of tensors of each file is checked against the checkpoint's weights.

    python bench/export_single_file.py            # about 6 GB of RAM to build the checkpoint, 16 GB of disk
    python bench/export_single_file.py --smoke    # the tiny checkpoint, for seconds
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, RUN, parse_args, report, tiny_checkpoint

DWB = ROOT / ".venv" / "bin" / "dwb"


def timed_export(checkpoint: str, out: Path, *flags: str) -> dict:
    """One `dwb export` in its own process: seconds, peak RSS (GiB) and the bytes written."""
    for path in (out, out.with_suffix(".yaml"), out.with_name(out.stem + ".config")):
        if path.is_dir():
            shutil.rmtree(path)
        elif path.is_file():
            path.unlink()
    t = time.perf_counter()
    run = subprocess.run(["/usr/bin/time", "-v", str(DWB), "export", checkpoint, str(out), *flags], cwd=ROOT,
                         capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if run.returncode != 0:
        raise SystemExit(f"dwb export {checkpoint} {out} {' '.join(flags)} failed:\n{run.stderr[-2000:]}")
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr).group(1))
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) if out.is_dir() else out.stat().st_size
    return {"seconds": round(seconds, 1), "peak_rss_gib": round(peak_kb / 2**20, 2), "bytes": size,
            "gb": round(size / 1e9, 3)}


def check_tensors(checkpoint: str, out: Path, half: bool) -> int:
    """Tensors of the file equal to the checkpoint's (cast to float16 with --half): the UNet's input and output
    convolutions, a VAE attention projection (a 1x1 convolution in the file) and a fused q/k/v; returns how many."""
    import torch
    from safetensors import safe_open

    from models.checkpoints.composer import model_weights, read_checkpoint

    weights = model_weights(read_checkpoint(checkpoint))
    dtype = torch.float16 if half else torch.float32
    q, k, v = (weights[f"text_encoder.text_model.encoder.layers.0.self_attn.{x}_proj.weight"] for x in "qkv")
    pairs = {"model.diffusion_model.input_blocks.0.0.weight": weights["unet.conv_in.weight"],
             "model.diffusion_model.out.2.weight": weights["unet.conv_out.weight"],
             "first_stage_model.decoder.mid.attn_1.q.weight":
                 weights["vae.decoder.mid_block.attentions.0.to_q.weight"][:, :, None, None],
             "cond_stage_model.model.transformer.resblocks.0.attn.in_proj_weight": torch.cat([q, k, v])}
    with safe_open(str(out), "pt") as f:
        for name, expected in pairs.items():
            if not torch.equal(f.get_tensor(name), expected.to(dtype)):
                raise SystemExit(f"{out}: {name} differs from the checkpoint's weights")
    return len(pairs)


def sd2_base_checkpoint() -> str:
    """SD2-base (random weights) as a Composer checkpoint of this project, its spec inside, built around one copy
    of the model (about 6 GB; door_cost.py's builder, which also writes a folder and a single file, holds two)."""
    import torch
    from composer import Trainer
    from composer.models import ComposerModel

    from _common import random_sd2_base
    from models.checkpoints.spec import make_spec
    from train.callbacks.spec import ModelSpec

    path = RUN.out / "sd2-base" / "sd2-base-rank0.pt"
    if path.is_file():
        return str(path)

    class Parts(ComposerModel):  # the parts under the names dwb train's model saves them by
        def __init__(self, pipe):
            super().__init__()
            self.unet, self.vae, self.text_encoder = pipe.unet, pipe.vae, pipe.text_encoder
            self.tokenizer, self.prediction_type = pipe.tokenizer, "epsilon"

        def forward(self, batch):
            return batch

        def loss(self, outputs, batch):
            return outputs.mean()

    with torch.no_grad():
        model = Parts(random_sd2_base(["a photo of a cat", "two red circles left of a blue square"]))
    trainer = Trainer(model=model, max_duration="1ba", device="cpu", progress_bar=False, log_to_console=False,
                      callbacks=[ModelSpec(make_spec(model, "sd2-base", 512))],
                      optimizers=torch.optim.SGD(model.unet.parameters(), lr=0.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    trainer.save_checkpoint(str(path))
    trainer.close()
    return str(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = parse_args(ap, smoke={})
    if args.build_only:
        sd2_base_checkpoint()
        return
    if RUN.smoke:
        checkpoint = str(tiny_checkpoint())
    else:  # built in a process of its own, so this one stays small while the exports run
        subprocess.run([sys.executable, __file__, "--out", str(RUN.out), "--build-only"], check=True)
        checkpoint = sd2_base_checkpoint()
    out = RUN.out / "export-bench"
    out.mkdir(parents=True, exist_ok=True)
    results = {"checkpoint": checkpoint, "checkpoint_bytes": Path(checkpoint).stat().st_size}
    cases = [("single_file_fp32", out / "sd2-fp32.safetensors", ()),
             ("single_file_fp16", out / "sd2-fp16.safetensors", ("--half",)),
             ("diffusers_folder_fp32", out / "sd2-folder", ())]
    for name, target, flags in cases[::2] if RUN.smoke else cases:  # a smoke run: one file and the folder
        results[name] = timed_export(checkpoint, target, *flags)
        if target.suffix == ".safetensors" and not RUN.smoke:
            results[name]["tensors_checked"] = check_tensors(checkpoint, target, half="--half" in flags)
            target.unlink()  # the disk a full-size run needs: one export at a time
        print(name, results[name], flush=True)
    folder = results["diffusers_folder_fp32"]
    for name in ("single_file_fp32", "single_file_fp16")[:1 if RUN.smoke else 2]:
        results[name]["time_vs_folder"] = round(results[name]["seconds"] / folder["seconds"], 2)
        results[name]["peak_rss_vs_folder"] = round(results[name]["peak_rss_gib"] / folder["peak_rss_gib"], 2)
    report("export_single_file", results)


if __name__ == "__main__":
    main()
