"""`dwb demo`: every stage on the offline shapes domain: data, tiny parts, precomputed latents, two phases,
export, grids, a score for every checkpoint (domain FID and attribute accuracy from the shapes scorer), the last
checkpoint compared with the middle one (the JSON and the page `dwb evaluate compare` writes, linked from the
report), and a blind A/B study of the first, middle and last checkpoints built from the scoring's own samples."""
from __future__ import annotations

import json
import shutil
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import psutil

from evaluate.attribute_accuracy import HEADLINE_COLUMNS

from .settings import FULL, GUIDANCE, QUICK, generation

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


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


def checkpoints(folder: Path) -> list:
    """A phase's checkpoints in training order (``models.checkpoints``)."""
    from models.checkpoints import list_checkpoints

    return list_checkpoints(folder, kinds=("composer",))


def label(phase: str, ckpt) -> str:
    """How the demo names a checkpoint in its tables, grids and study: its phase and batch count."""
    return f"{phase}/ba{ckpt.step}"


def prepare_stages(out: Path, p: dict, seed: int, quick: bool, stages: list) -> dict:
    """Data, the tiny parts, the shapes scorer and phase 2's precomputed latents; the scorer's summary."""
    from train.data import precompute_latents
    from train.shapes import prepare_tiny, write_shapes_dataset
    from models.shapes import train_scorer

    with measured("data: shapes dataset", stages):
        write_shapes_dataset(out / "shapes", p["n"], seed, sizes=(16, 32), n_eval=p["n_eval"], progress=not quick)
    with measured("prepare: tokenizer, text encoder, tiny VAE", stages):
        prepare_tiny(out / "shapes", out / "components", vae_steps=p["vae_steps"], seed=seed, progress=not quick)
    with measured("scorer: shapes attribute classifier (domain FID features)", stages):
        scorer = train_scorer(out / "shapes", out / "scorer.pt", epochs=p["scorer_epochs"], seed=seed, progress=not quick)
    stages[-1]["held_out_accuracy"] = scorer.get("held_out")
    # Phase 2 reads its 32 px data ~5 times over, so it trains on stored latents; phase 1 reads less
    # than an epoch and encodes on the fly (both paths in one demo).
    with measured("precompute: VAE latents and text states (32 px bucket)", stages):
        parts = str(out / "components")
        precompute_latents(str(out / "shapes"), str(out / "latents"), vae_ref=parts, text_encoder_ref=parts,
                   tokenizer_ref=parts, resolutions=[32], batch_size=256, progress=not quick)
    return scorer


def phase_config(out: Path, p: dict, seed: int, quick: bool, recipe: str, phase: str, precomputed: bool):
    """A phase's config of ``recipe`` (``configs/{recipe}-{phase}.yaml``) on the demo's data, parts and seed."""
    from train.config import load_config

    common = [f"model.pretrained={out / 'components'}", f"seed={seed + 17}", f"progress_bar={not quick}", *p["train"]]
    cfg = load_config(CONFIGS / f"{recipe}-{phase}.yaml",
                      common + [f"save_folder={out / 'runs' / (recipe + '-' + phase) / 'checkpoints'}"])
    res = cfg.data.resolution
    if phase == "phase2" and precomputed:
        cfg.data.path, cfg.data.precomputed = str(out / "latents" / str(res)), True
    else:
        cfg.data.path = str(out / "shapes" / str(res))
    cfg.validation.path = str(out / "shapes" / "eval" / "32")  # the held-out split, read at the phase's size
    cfg.loggers = ["file", "tensorboard"]
    return cfg


def train_phases(out: Path, p: dict, seed: int, quick: bool, stages: list, recipe: str = "tiny",
                 phase2_batches: int | None = None) -> tuple[dict, dict]:
    """Both phases of ``recipe``, phase 2 from phase 1's last checkpoint (``phase2_batches``: its length, else the
    config's); (checkpoint folder, resolution) by phase. The UNet's phase 2 reads precomputed latents; the
    transformer's reads images (its text conditioning needs the captions)."""
    from train.trainer import train

    phase_dirs, resolutions = {}, {}
    for phase in ("phase1", "phase2"):
        cfg = phase_config(out, p, seed, quick, recipe, phase, precomputed=recipe == "tiny")
        if phase == "phase2":
            cfg.load_path = str(checkpoints(phase_dirs["phase1"])[-1].path)
            if phase2_batches is not None:
                cfg.max_duration = cfg.save_interval = f"{phase2_batches}ba"
        res = resolutions[phase] = cfg.data.resolution
        with measured(f"train: {recipe} {phase} at {res} px ({cfg.max_duration})", stages):
            phase_dirs[phase] = train(cfg)
    return phase_dirs, resolutions


def training_flops(out: Path, p: dict, seed: int, quick: bool, recipe: str, batches: dict[str, int]) -> float:
    """The FLOPs of ``recipe``'s phases at ``batches`` each, counted on one batch per phase (``train.flops``)."""
    from train.flops import batch_flops

    return sum(batch_flops(phase_config(out, p, seed, quick, recipe, phase, precomputed=False)) * n
               for phase, n in batches.items())


def equal_flops_phase2(out: Path, p: dict, seed: int, quick: bool) -> dict:
    """The transformer's phase-2 length that makes its two phases' training FLOPs the UNet's (phase 1 as long as
    the UNet's, as its config says), and both totals."""
    from train.trainer import batch_count

    phases = {phase: batch_count(phase_config(out, p, seed, quick, "tiny", phase, False).max_duration)
              for phase in ("phase1", "phase2")}
    unet = training_flops(out, p, seed, quick, "tiny", phases)
    first = training_flops(out, p, seed, quick, "tiny-mmdit", {"phase1": phases["phase1"]})
    per_batch = training_flops(out, p, seed, quick, "tiny-mmdit", {"phase2": 1})
    phase2 = max(1, round((unet - first) / per_batch))
    return {"unet_batches": phases, "unet_flops": unet, "transformer_batches": {**phases, "phase2": phase2},
            "transformer_flops": first + phase2 * per_batch}


def write_grids(out: Path, phase_dirs: dict, resolutions: dict, steps: int) -> list[Path]:
    """One grid PNG per checkpoint of both phases (EMA weights), its settings in its PNG parameters."""
    from models.checkpoints import content_hash, load_pipeline, weights_of
    from models.generation import Settings, write_grid

    grids = []
    for phase, folder in phase_dirs.items():
        settings = Settings(steps=steps, guidance=GUIDANCE, width=resolutions[phase], height=resolutions[phase])
        for ckpt in checkpoints(folder):
            png = out / "grids" / f"{label(phase, ckpt).replace('/', '-')}.png"
            weights = weights_of(ckpt)
            write_grid(load_pipeline(ckpt, ema=weights == "ema"), png, settings=settings,
                       title=f"{label(phase, ckpt)} ({weights} weights), guidance {GUIDANCE:g}",
                       checkpoint=label(phase, ckpt), checkpoint_hash=content_hash(ckpt), weights=weights)
            grids.append(png)
    return grids


def curves_and_cost(out: Path, phase_dirs: dict, final) -> dict:
    """Both phases' curves in one figure, and the cost table: what the demo's schedule costs at the throughput
    phase 2 measured, and what its last checkpoint recorded."""
    import torch

    from models.checkpoints import checkpoint_cost
    from train.callbacks import measured_from_run, plan_rows, plot_runs, schedule_samples, table
    from train.config import load_config

    runs = [folder.parent for folder in phase_dirs.values()]
    figure = plot_runs(runs, out / "curves.png")
    gpus, rate = measured_from_run(runs[-1])
    samples = schedule_samples([load_config(CONFIGS / f"tiny-{phase}.yaml") for phase in phase_dirs])
    cost = checkpoint_cost(final.path)
    rows = plan_rows({gpus: rate}, samples, [gpus], 0.95, None)
    return {"curves": str(figure), "cost_table": table(rows, 0.95), "final_checkpoint_cost": cost,
            "trained_on": "gpu" if torch.cuda.is_available() else "cpu", "schedule_process_hours": rows[0].gpu_hours}


def transformer_at_equal_flops(out: Path, p: dict, seed: int, quick: bool, stages: list, unet_scores: list[dict]) -> dict:
    """The tiny MMDiT trained with rectified flow on the same data, parts and seed as the UNet, for the same training
    FLOPs (counted), scored on the same prompts and seeds, and compared with the UNet's last checkpoint (A) by
    `dwb evaluate compare`'s paired intervals."""
    with measured("count: training FLOPs of both recipes, one batch of each phase", stages):
        budget = equal_flops_phase2(out, p, seed, quick)
    dirs, resolutions = train_phases(out, p, seed, quick, stages, recipe="tiny-mmdit",
                                     phase2_batches=budget["transformer_batches"]["phase2"])
    with measured("evaluate: the transformer's last checkpoint, compared with the UNet's", stages):
        scores = score_checkpoints(out, {"transformer-phase2": dirs["phase2"]},
                                   {"transformer-phase2": resolutions["phase2"], "phase2": resolutions["phase2"]},
                                   n_prompts=p["score_prompts"], steps=p["steps"], seed=seed, progress=not quick)
        comparison, page = compare_models(out, unet_scores[-1]["model"], scores[-1]["model"], seed)
    return {**budget, "scores": scores, "comparison": comparison, "compare_page": str(page),
            "checkpoints": str(dirs["phase2"])}


def run_demo(out: Path, quick: bool = False, seed: int = 0, with_transformer: bool = False) -> dict:
    from models.checkpoints import export_pipeline, recommended_settings, write_recommended

    p = QUICK if quick else FULL
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    stages: list[dict] = []
    t_start = time.perf_counter()
    # From the process's start to here: interpreter, imports (torch, diffusers, Composer), removing the old output.
    startup = round(time.time() - psutil.Process().create_time(), 1)
    scorer = prepare_stages(out, p, seed, quick, stages)
    phase_dirs, resolutions = train_phases(out, p, seed, quick, stages)
    final = checkpoints(phase_dirs["phase2"])[-1]
    run_in_sight = curves_and_cost(out, phase_dirs, final)
    with measured("export: last checkpoint -> diffusers folder (EMA)", stages):
        export_pipeline(final.path, out / "export", ema=True)
        write_recommended(out / "export", recommended_settings(final))  # guidance 3, 20 steps, as `dwb export` writes
    with measured("grids: one per checkpoint", stages):
        grids = write_grids(out, phase_dirs, resolutions, p["steps"])
    with measured(f"evaluate: every checkpoint (domain FID, attribute accuracy at guidance {GUIDANCE:g}), the last "
                  "against the middle one", stages):
        scores = score_checkpoints(out, phase_dirs, resolutions, n_prompts=p["score_prompts"], steps=p["steps"],
                                   seed=seed, progress=not quick)
        comparison, compare_page = compare_last_with_middle(out, scores, seed)
    transformer = transformer_at_equal_flops(out, p, seed, quick, stages, scores) if with_transformer else None
    with measured("study: blind A/B pairs of the first, middle and last checkpoints"
                  + (" and the transformer's last" if transformer else ""), stages):
        study = write_study(out, scores, transformer["scores"][-1:] if transformer else [])
    report = {"quick": quick, "seed": seed, "startup_seconds": startup,
              "total_seconds": round(time.perf_counter() - t_start, 1), "stages": stages,
              "final_checkpoint": str(final.path), "export": str(out / "export"), "grids": [str(g) for g in grids],
              "generation": generation(quick), "scorer": str(out / "scorer.pt"), "scores": scores,
              "comparison": comparison, "compare_page": str(compare_page),
              "evaluation": str(out / "eval" / "report" / "index.html"), "study": study,
              **({"transformer": transformer} if transformer else {}), **run_in_sight}
    (out / "demo.json").write_text(json.dumps(report, indent=2))
    print_summary(out, report, scorer)
    return report


def print_summary(out: Path, report: dict, scorer: dict) -> None:
    """Stage times, the scores table and where everything is."""
    print()
    for s in report["stages"]:
        print(f"  {s['seconds']:7.1f} s  {s['peak_rss_mib']:6d} MiB  {s['stage']}")
    print(f"  {report['total_seconds']:7.1f} s  total ({report['startup_seconds']:.1f} s before the first stage: "
          "start-up, imports, old output removed)")
    print_scores(report["scores"] + (report["transformer"]["scores"] if "transformer" in report else []))
    print(f"\n{cost_text(report)}\ncurves:      {report['curves']}")
    held = scorer.get("held_out") or {}
    if held:
        print("  scorer's accuracy on held-out real images: " + ", ".join(f"{k} {v:.3f}" for k, v in held.items()))
    study = report["study"]
    print(f"\ndata:        {out / 'shapes'}\ncomponents:  {out / 'components'}\ncheckpoints: {out / 'runs'}\n"
          f"export:      {out / 'export'}  (StableDiffusionPipeline.from_pretrained)\ngrids:       {out / 'grids'}"
          f"  (last: {Path(report['grids'][-1]).name})\nscores:      {out / 'eval' / 'report' / 'index.html'}"
          f"\ncompare:     {report['compare_page']}  (last vs middle, as `dwb evaluate compare` writes it)"
          f"\nreport:      {out / 'demo.json'}")
    print(f"\nstudy:       {study['folder']}  ({study['pairs']} pairs of {', '.join(study['models'])})\n"
          f"  rate:      dwb human-eval serve {study['folder']}\n  results:   dwb human-eval report {study['folder']}")
    print(f"\n{closing_answer(report['comparison'])}")
    if "transformer" in report:
        t = report["transformer"]
        print(f"{closing_answer(t['comparison'], 'Transformer vs UNet at equal training FLOPs')} Training FLOPs "
              f"(counted): UNet {t['unet_flops'] / 1e9:,.0f} GFLOP, transformer {t['transformer_flops'] / 1e9:,.0f} "
              f"GFLOP; page: {t['compare_page']}")


def cost_text(report: dict) -> str:
    """The schedule's cost table and what the last checkpoint took; on a CPU, a line under the table saying what its
    GPUs and GPU-hours count there, and why its cost reads "-"."""
    cost = report["final_checkpoint_cost"]
    lines = ["cost of the configs' schedule (phase 1 + phase 2 samples) at phase 2's measured throughput, one "
             "process:", report["cost_table"]]
    if report.get("trained_on") == "cpu":
        lines.append(f"no GPU: the demo trained on the CPU, so the table's GPUs are CPU processes and its GPU-hours "
                     f"CPU process-hours ({report['schedule_process_hours']:.3g} for the schedule); no price per hour "
                     f"is set, so its cost is \"-\"")
    lines.append(f"the last checkpoint took {cost.get('gpu_hours_total', 0):.3f} process-hours to reach (both phases)")
    return "\n".join(lines)


SCORE_KEYS = ("fid", *HEADLINE_COLUMNS)


def score_checkpoints(out: Path, phase_dirs: dict, resolutions: dict, *, n_prompts: int, steps: int, seed: int,
                      progress: bool) -> list[dict]:
    """Score every checkpoint of both phases (EMA weights) with `dwb evaluate`'s Evaluator on the shapes scorer."""
    from evaluate.report import write_report
    from evaluate.run import EvalConfig, Evaluator

    cfg = EvalConfig(out=str(out / "eval"), reference=str(out / "shapes" / "eval" / str(resolutions["phase2"])),
                     scorer=str(out / "scorer.pt"), prompts="shapes", n_prompts=n_prompts, n_reference=n_prompts,
                     guidance=(GUIDANCE,), steps=steps, batch_size=64, seed=seed, kid_subset_size=100,
                     progress=progress)
    ev = Evaluator(cfg)
    rows = []
    for phase, folder in phase_dirs.items():
        ev.cfg.size = resolutions[phase]
        for ckpt in checkpoints(folder):
            rows += ev.score(ckpt, model=label(phase, ckpt))
    ev.store.export_csv()
    write_report(cfg.out)
    return [{"model": r["model"], "step": r["step"], "size": r["size"], "n_images": r.get("n_images"),
             "weights": r["weights"], "attr_n_object": r.get("attr_n_object"),
             "samples": str(Path(cfg.out) / r["samples"]), **{k: r.get(k) for k in SCORE_KEYS}} for r in rows]


def compare_last_with_middle(out: Path, scores: list[dict], seed: int) -> tuple[dict, Path]:
    """`dwb evaluate compare`'s paired comparison of the last scored checkpoint (B) with the middle one (A), written
    where `dwb evaluate compare` writes it: the JSON, the comparison page, and the report again (it lists both)."""
    return compare_models(out, scores[len(scores) // 2]["model"], scores[-1]["model"], seed)


def compare_models(out: Path, a: str, b: str, seed: int) -> tuple[dict, Path]:
    """B against A as `dwb evaluate compare` compares two scored models: the JSON, the page, the report again."""
    from evaluate.compare import compare_store, write_comparison
    from evaluate.compare_page import write_compare_page
    from evaluate.report import write_report

    results = compare_store(out / "eval", a, b, seed=seed)  # one guidance scale, one sampler
    write_comparison(out / "eval", results[0])
    page = write_compare_page(out / "eval", a, b, results)
    write_report(out / "eval")
    return results[0], page


# The demo's question, asked before it runs: do the images look more like the shapes (FID on the scorer's
# features) and are more prompts drawn fully right. Each is read alone, as asked, with no Holm adjustment.
ANSWER_METRICS = ("fid", HEADLINE_COLUMNS[-1])


def closing_answer(comparison: dict, question: str = "Last checkpoint vs middle") -> str:
    """One sentence: is B better than A (the last checkpoint than the middle one), by how much and how sure, in the
    words, intervals and p-values of `dwb evaluate compare` (``evaluate.verdict``)."""
    from evaluate.verdict import brief

    found = {m["metric"]: m for m in comparison["metrics"]}
    answers = "; ".join(brief(found[key]) for key in ANSWER_METRICS if key in found)
    return (f"{question} (B = {comparison['b']}, A = {comparison['a']}, paired over the same "
            f"{comparison['n_prompts']} prompts and seeds): {answers}.")


def write_study(out: Path, scores: list[dict], others: list[dict] = ()) -> dict:
    """A blind A/B study (`dwb human-eval`) of the first, middle and last scored checkpoints (and ``others``: the
    transformer's last), from the sample manifests their scoring wrote: the same prompts and seeds for each, paired
    by prompt."""
    from human_eval.samples import read_manifest
    from human_eval.study import build_study

    chosen = [scores[0], scores[len(scores) // 2], scores[-1], *others]
    samples = [s for row in chosen for s in read_manifest(Path(row["samples"]) / "manifest.jsonl")]
    study, summary = build_study(samples, out / "study", gold=4, repeats=4, seed=0, progress=False)
    return {"folder": str(study.folder), "models": [row["model"] for row in chosen], "pairs": summary["pairs"]}


def print_scores(scores: list[dict]) -> None:
    """The table of how the model learned its prompts, checkpoint by checkpoint."""
    weights = ", ".join(sorted({r["weights"] for r in scores}))
    print(f"\nscores at guidance {GUIDANCE:g} ({weights} weights; shapes scorer on held-out prompts):")
    widths = (10, 7, 6, 6, 8, 10, 10)
    print(f"  {'checkpoint':24s} {'px':>3s} {'domain FID':>10s} {'colour':>7s} {'shape':>6s} {'count':>6s} "
          f"{'position':>8s} {'all right:':>10s} {'all right:':>10s}")
    print(f"  {'':24s} {'':>3s} {'':>10s} {'':>7s} {'':>6s} {'':>6s} {'':>8s} {'one object':>10s} {'all':>10s}")
    for r in scores:
        vals = [r.get(k) for k in SCORE_KEYS]
        cells = [f"{v:10.2f}" if i == 0 else f"{v:{w}.2f}" if v is not None else f"{'-':>{w}s}"
                 for i, (v, w) in enumerate(zip(vals, widths))]
        print(f"  {r['model']:24s} {r['size']:3d} " + " ".join(cells))
    last = scores[-1] if scores else {}
    print("  (colour, shape, count: one-group prompts; position: two-group prompts; all right: every attribute, on\n"
          f"   the {last.get('attr_n_object')} one-object prompts such as 'a red circle' and on all {last.get('n_images')} prompts)")
