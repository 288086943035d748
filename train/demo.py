"""`dwb demo`: every stage on the offline shapes domain: data, tiny parts, precomputed latents, two phases,
export, grids."""
from __future__ import annotations

import json
import shutil
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import psutil

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

# Phase lengths, batch and resolution come from configs/tiny-phase{1,2}.yaml; --quick shrinks them.
FULL = dict(n=16000, n_eval=1000, vae_steps=1000, steps=20, train=[])
QUICK = dict(n=256, n_eval=32, vae_steps=10, steps=4,
             train=["max_duration=4ba", "save_interval=2ba", "global_train_batch_size=16", "device_train_microbatch_size=16"])


@contextmanager
def measured(name: str, stages: list):
    """Wall time and peak resident memory (sampled every 50 ms) of one stage."""
    proc, peak, stop = psutil.Process(), [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            stop.wait(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    print(f"== {name}", flush=True)
    try:
        yield
    finally:
        stop.set()
        thread.join()
        peak[0] = max(peak[0], proc.memory_info().rss)
        stages.append({"stage": name, "seconds": round(time.perf_counter() - t0, 1), "peak_rss_mib": round(peak[0] / 2**20)})


def checkpoints(folder: Path) -> list[Path]:
    """ep*-ba*-rank0.pt in batch order."""
    return sorted(folder.glob("ep*-ba*-rank0.pt"), key=lambda p: int(p.name.split("-ba")[1].split("-")[0]))


def run_demo(out: Path, quick: bool = False, seed: int = 0) -> dict:
    from .config import load_config
    from .grid import write_grid
    from .pipeline import export_pipeline, load_pipeline
    from .precompute import precompute
    from .prepare import prepare_tiny
    from .shapes import write_shapes_dataset
    from .trainer import train

    p = QUICK if quick else FULL
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    stages: list[dict] = []
    t_start = time.perf_counter()
    with measured("data: shapes dataset", stages):
        write_shapes_dataset(out / "shapes", p["n"], seed, sizes=(16, 32), n_eval=p["n_eval"], progress=not quick)
    with measured("prepare: tokenizer, text encoder, tiny VAE", stages):
        prepare_tiny(out / "shapes", out / "components", vae_steps=p["vae_steps"], seed=seed, progress=not quick)
    # Phase 2 reads its 32 px data ~5 times over, so it trains on stored latents; phase 1 reads less
    # than an epoch and encodes on the fly (both paths in one demo).
    with measured("precompute: VAE latents and text states (32 px bucket)", stages):
        parts = str(out / "components")
        precompute(str(out / "shapes"), str(out / "latents"), vae_ref=parts, text_encoder_ref=parts,
                   tokenizer_ref=parts, resolutions=[32], batch_size=256, progress=not quick)

    runs = out / "runs"
    common = [f"model.pretrained={out / 'components'}", f"seed={seed + 17}", f"progress_bar={not quick}", *p["train"]]
    phase_dirs, resolutions = {}, {}
    for phase in ("phase1", "phase2"):
        overrides = common + [f"save_folder={runs / ('tiny-' + phase) / 'checkpoints'}"]
        if phase == "phase2":
            overrides.append(f"load_path={checkpoints(phase_dirs['phase1'])[-1]}")
        cfg = load_config(CONFIGS / f"tiny-{phase}.yaml", overrides)
        res = resolutions[phase] = cfg.data.resolution
        if phase == "phase2":
            cfg.data.path, cfg.data.precomputed = str(out / "latents" / str(res)), True
        else:
            cfg.data.path = str(out / "shapes" / str(res))
        with measured(f"train: {phase} at {res} px ({cfg.max_duration})", stages):
            phase_dirs[phase] = train(cfg)

    final = checkpoints(phase_dirs["phase2"])[-1]
    with measured("export: last checkpoint -> diffusers folder (EMA)", stages):
        export_pipeline(final, out / "export", ema=True)
    grids = []
    with measured("grids: one per checkpoint", stages):
        for phase, folder in phase_dirs.items():
            res = resolutions[phase]
            for ckpt in checkpoints(folder):
                png = out / "grids" / f"{phase}-{ckpt.name.split('-rank')[0]}.png"
                write_grid(load_pipeline(ckpt, ema=True), png, title=f"{phase} {ckpt.name} (EMA), guidance 5",
                           steps=p["steps"], size=res)
                grids.append(png)
    total = round(time.perf_counter() - t_start, 1)
    report = {"quick": quick, "seed": seed, "total_seconds": total, "stages": stages,
              "final_checkpoint": str(final), "export": str(out / "export"), "grids": [str(g) for g in grids]}
    (out / "demo.json").write_text(json.dumps(report, indent=2))
    print()
    for s in stages:
        print(f"  {s['seconds']:7.1f} s  {s['peak_rss_mib']:6d} MiB  {s['stage']}")
    print(f"  {total:7.1f} s  total")
    print(f"\ndata:        {out / 'shapes'}\ncomponents:  {out / 'components'}\ncheckpoints: {runs}\n"
          f"export:      {out / 'export'}  (StableDiffusionPipeline.from_pretrained)\ngrids:       {out / 'grids'}"
          f"  (last: {grids[-1].name})\nreport:      {out / 'demo.json'}")
    return report
