"""Teaching the demo's tiny model a shape (or colour) its data never held, from 30 images, with a LoRA and with a full
fine-tune.

The base is the demo's last checkpoint: `--demo DIR` takes a `dwb demo` output as it is; without it the demo's own
stages (`demo.run.prepare_stages`, `train_phases`) build one here at smaller sizes (the shapes data, the tiny parts and
the scorer, phase 1 as configured, phase 2 shortened to --phase2-batches), once per output folder. The concept is one
of the shapes domain's ``NEW_SHAPES`` (--shape, default "star"), drawn in the data's own colours, or one of its
``NEW_COLORS`` (--color): the captions and the renderer know it, the data never draws it. 30 scenes holding it in one
group, captioned by the grammar ("two small red stars above a blue square": the shape's word is the trigger, a word
the model's captions never held), go through `dwb data dreambooth` (10 repeats); two runs of `dwb train`'s Composer Trainer start from the base (`model.init_from`) with the
same data, steps, batch and schedule: one with `adapter.type=lora` (the preset: rank 4 on the attention projections),
one a full fine-tune of the UNet, each at its own lr (--lora-lr, --full-lr), EMA off; the VAE and the text tower stay
frozen in both. The shapes scorer is taught the concept too (`models.shapes.teach_new_concepts`: its colour and shape
heads grown and fitted on rendered scenes that hold it, of a seed of their own, mixed with the shapes data).

Then the adapter report's own functions (``evaluate.adapter_report``) score the base, the base with the LoRA at
strength 1 and the full fine-tune on the same prompts and seeds: fidelity (DINO and CLIP image cosine to the training
images), adherence on held-out prompts asking for the concept (CLIP score; every asked shape, or colour, right and
every attribute right as the taught scorer reads them), drift on the shapes' own held-out prompts, which never name it
(DINO distance from the base's image at the same seed; every asked shape, or colour, and every attribute right: does
the model still draw what it drew), each a paired difference with its interval and its verdict after Holm's adjustment within its
family. No DINOv2 or CLIP weights can be downloaded here: both are small networks of seeded random weights (as the
tests build them), so their figures compare images by what random features see (colour and layout statistics), not
by what the published models see; the scorer's figures are the domain's own. The training images' shapes (colours)
read after the base's VAE encodes and decodes them bound what either run can draw: --round-trip-only reads them, and
teaches the scorer, without training anything.

CPU:   OMP_NUM_THREADS=1 python bench/adapter_concept.py [--color cyan]   (the base, then 200 steps of 16 per kind)
       OMP_NUM_THREADS=1 python bench/adapter_concept.py --round-trip-only   (the base, the scorer, the VAE round trip)
       python bench/adapter_concept.py --demo demo-output
Smoke: python bench/adapter_concept.py --smoke         (the demo's --quick sizes, 2 steps, 4 prompts)
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from _common import ROOT, RUN, parse_args, report

from models.shapes import NEW_COLORS, NEW_SHAPES

KINDS = {"lora": "LoRA (rank 4)", "full": "full fine-tune"}
SIDE = 32  # the demo's phase-2 resolution, and the scorer's


def home() -> Path:
    """Where this benchmark builds and writes, inside the output folder the benchmarks share (the base)."""
    return RUN.out / "adapter-concept"


def built(args) -> Path:
    """Where one new colour's or shape's images, runs, scorer and report go."""
    return home() / args.name


def concept_keywords(args) -> dict:
    """The keywords that make a shapes sample hold the concept: ``new_shape="star"`` or ``new_color="cyan"``."""
    return {f"new_{args.attribute}": args.name}


def base_model(args, stages: list) -> dict:
    """The base checkpoint, its scorer, data and parts, and the demo's sampling steps: a `dwb demo` output under
    --demo, else built once under OUT/base by the demo's own stages."""
    if args.demo:
        folder = Path(args.demo)
        demo = json.loads((folder / "demo.json").read_text())
        return {"checkpoint": demo["final_checkpoint"], "scorer": demo["scorer"], "shapes": str(folder / "shapes"),
                "components": str(folder / "components"), "steps": demo["generation"]["steps"], "built": False}
    out = home() / "base"
    record = out / "base.json"
    if record.is_file():
        return json.loads(record.read_text())
    from demo.run import checkpoints, prepare_stages, train_phases
    from demo.settings import FULL, QUICK

    p = dict(QUICK) if RUN.smoke else {**FULL, "n": args.images, "n_eval": 256, "vae_steps": args.vae_steps,
                                       "scorer_epochs": 3}
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    prepare_stages(out, p, args.seed, RUN.smoke, stages)
    dirs, _ = train_phases(out, p, args.seed, RUN.smoke, stages, phase2_batches=args.phase2_batches)
    base = {"checkpoint": str(checkpoints(dirs["phase2"])[-1].path), "scorer": str(out / "scorer.pt"),
            "shapes": str(out / "shapes"), "components": str(out / "components"), "steps": p["steps"],
            "built": {"images": p["n"], "vae_steps": p["vae_steps"], "phase2_batches": args.phase2_batches}}
    record.write_text(json.dumps(base, indent=1))
    return base


def concept_samples(args, seed: int, split: str, n: int) -> list[dict]:
    """``n`` shapes samples holding the new colour or shape in one group (32 px)."""
    from models.shapes import make_sample

    return [make_sample(seed, split, i, (SIDE,), **concept_keywords(args)) for i in range(n)]


def as_tensors(samples: list[dict]):
    """Samples as the scorer reads them: (N, 3, 32, 32) uint8 and their scenes."""
    import numpy as np
    import torch

    from models.shapes.grammar import scene_from_meta

    images = np.stack([np.asarray(s["images"][SIDE].convert("RGB")) for s in samples])
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), [scene_from_meta(s["meta"]) for s in samples]


def concept_data(args) -> tuple[Path, Path]:
    """The training images (a folder of PNGs with their captions) and their `dwb data dreambooth` dataset."""
    from train.data import write_dreambooth

    folder, data = built(args) / "images", built(args) / "data"
    if not (data / "dreambooth.json").is_file():
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)
        folder.mkdir(parents=True)
        for i, sample in enumerate(concept_samples(args, args.seed, "train", args.concept_images)):
            sample["images"][SIDE].save(folder / f"{i:03d}.png")
            (folder / f"{i:03d}.txt").write_text(sample["caption"] + "\n")
        write_dreambooth(folder, data, sizes=(SIDE,), repeats=args.repeats, say=lambda line: print(line, flush=True))
    return folder, data


def fine_tune(kind: str, base: dict, data: Path, args) -> tuple[Path, float]:
    """One run of `dwb train` from the base on the concept's dataset; its last checkpoint and wall time."""
    from train.config import load_config
    from train.trainer import train

    folder = built(args) / "runs" / kind
    shutil.rmtree(folder, ignore_errors=True)
    lr = args.lora_lr if kind == "lora" else args.full_lr
    keys = [f"model.init_from={base['checkpoint']}", f"data.path={data / str(SIDE)}", f"data.resolution={SIDE}",
            "load_path=null", f"save_folder={folder}", f"max_duration={args.steps}ba", f"save_interval={args.steps}ba",
            f"global_train_batch_size={args.batch}", f"device_train_microbatch_size={args.batch}",
            f"optimizer.lr={lr}", f"scheduler.t_warmup={args.steps // 10}ba", "ema.enabled=false",
            "eval_interval=null", "preview_interval=null", "progress_bar=false", "loggers=[]",
            f"seed={args.seed + 17}", f"run_name=concept-{kind}", *(["adapter.type=lora"] if kind == "lora" else [])]
    t0 = time.perf_counter()
    train(load_config(ROOT / "configs/tiny-phase2.yaml", keys))
    return folder / "latest-rank0.pt", round(time.perf_counter() - t0, 1)


def taught_scorer(base: dict, args) -> tuple[Path, dict]:
    """The base's scorer taught the concept from rendered scenes of a seed of their own (not the 30 training
    images, not the held-out prompts' scenes), checked on held-out ones."""
    from models.shapes import teach_new_concepts

    out = built(args) / "scorer.pt"
    new = as_tensors(concept_samples(args, args.seed + 1, "train", args.scorer_images))
    held = as_tensors(concept_samples(args, args.seed + 1, "eval", args.scorer_images // 4))
    info = teach_new_concepts(base["scorer"], base["shapes"], out, new, held, base_images=args.scorer_images * 4,
                            epochs=args.scorer_epochs, seed=args.seed)
    return out, info


def random_scoring_models(components: str, folder: Path) -> tuple[Path, Path]:
    """A small DINOv2 and a small CLIP (with the base's tokenizer) of seeded random weights, saved as folders: no
    published weights can be downloaded here. DINOv2 is initialised at std 0.2, where its features vary with the
    image (at the config's 0.02 its CLS and position embeddings outweigh the image: tests/conftest.py)."""
    import torch
    from transformers import (CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer, Dinov2Config,
                              Dinov2Model)

    dino, clip = folder / "dinov2-random", folder / "clip-random"
    torch.manual_seed(0)
    Dinov2Model(Dinov2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                             patch_size=14, image_size=224, initializer_range=0.2)).save_pretrained(dino)
    tokenizer = CLIPTokenizer.from_pretrained(Path(components) / "tokenizer")
    text = dict(vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=2, max_position_embeddings=77, bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                  patch_size=8)
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=32)).save_pretrained(clip)
    CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
                  tokenizer=tokenizer).save_pretrained(clip)
    return dino, clip


def prompt_files(args) -> tuple[Path, Path]:
    """Held-out prompts asking for the concept (scenes of the eval split of the training images' seed) and neutral
    ones (the shapes domain's own held-out prompts, which never name it), as CSV files."""
    from models.shapes import sample_meta, shapes_prompts

    held = built(args) / "held-out.csv"
    neutral = built(args) / "neutral.csv"
    held.write_text("prompt\n" + "".join(sample_meta(args.seed, "eval", i, **concept_keywords(args))[0] + "\n"
                                         for i in range(args.prompts)))
    neutral.write_text("prompt\n" + "".join(text + "\n" for text, _ in shapes_prompts(args.prompts, args.seed)))
    return held, neutral


def scored(base: dict, lora: Path, full: Path, scorer: Path, images: Path, args) -> dict:
    """The base, the base with the LoRA at strength 1 and the full fine-tune, drawn on the same prompts and seeds and
    compared with the base as the adapter report compares (``evaluate.adapter_report``'s functions), plus every
    attribute right on the neutral prompts."""
    from demo.settings import GUIDANCE
    from evaluate.adapter_report import (AdapterSetup, Scorers, _zero_drift, adapter_entries, draw_side,
                                         paired_figures, side_values)
    from evaluate.prompts import load_prompts
    from models.checkpoints import find_entry
    from models.generation import pick_device

    dino, clip = random_scoring_models(base["components"], built(args))
    held, neutral = prompt_files(args)
    setup = AdapterSetup(images=str(images), prompts=str(held), neutral=str(neutral), out=str(built(args) / "report"),
                         dinov2=str(dino), clip=str(clip), strengths=(1.0,), scorer=str(scorer), guidance=GUIDANCE,
                         steps=base["steps"], size=SIDE, seed=args.seed, batch_size=64, device="cpu")
    device = pick_device(setup.device)
    prompt_sets = {"held-out": load_prompts(setup.prompts), "neutral": load_prompts(setup.neutral)}
    scorers = Scorers(setup, device)
    training = scorers.training_features(setup.images)
    found = find_entry(base["checkpoint"])
    base_drawn = draw_side(found, setup, scorers, prompt_sets, device)
    base_values = _zero_drift(side_values(base_drawn["held-out"], base_drawn["neutral"], base_drawn["neutral"],
                                          training))
    entries = {"lora": adapter_entries(found, [lora], (1.0,))[0], "full": find_entry(full)}
    results = {}
    for kind, entry in entries.items():
        drawn = draw_side(entry, setup, scorers, prompt_sets, device)
        values = side_values(drawn["held-out"], drawn["neutral"], base_drawn["neutral"], training)
        results[kind] = {"entry": entry.label, "samples": drawn["held-out"]["folder"],
                         "metrics": paired_figures(base_values, values, setup.bootstrap, setup.seed)["metrics"],
                         "domain": domain_figures(scorers.domain, setup, prompt_sets, base_drawn, drawn,
                                                  args.attribute)}
    return {"n_prompts": {k: len(v) for k, v in prompt_sets.items()}, "guidance": GUIDANCE, "steps": base["steps"],
            "n_training_images": int(training["dino"].shape[0]), "base": found.label, "entries": results,
            "right_on_training_images": vae_round_trip(base, scorers.domain, images, args.attribute)}


def attribute_verdicts(scorer, folder: Path, prompts: list, attribute: str) -> tuple:
    """(prompt ids, per image 1 where ``scorer`` reads every ``attribute`` ("color" or "shape") the caption asks for,
    else 0) of one side's saved images of one prompt set, in the order the report keeps them (prompt, then image)."""
    import numpy as np
    import torch
    from PIL import Image

    from evaluate.attribute_accuracy import judge
    from models.shapes import parse_caption

    files = sorted((folder / "images").glob("*.png"))  # PROMPT-IMAGE.png
    ids = np.array([int(f.name.split("-")[0]) for f in files])
    images = torch.from_numpy(np.stack([np.asarray(Image.open(f).convert("RGB")) for f in files])).permute(0, 3, 1, 2)
    texts = {p.index: p.text for p in prompts}
    seen = scorer.predict(images.contiguous())
    return ids, np.array([float(judge(parse_caption(texts[i]), s)[attribute]) for i, s in zip(ids, seen)])


def vae_round_trip(base: dict, scorer, images: Path, attribute: str) -> dict:
    """What the frozen parts allow: the share of the training images whose every asked ``attribute`` (the concept's:
    "color" or "shape") the taught scorer reads, as rendered and after the base's VAE (frozen in both runs) encodes
    and decodes them: a denoiser trained on its latents draws at best what it decodes."""
    import numpy as np
    import torch
    from diffusers import AutoencoderKL
    from PIL import Image

    from evaluate.attribute_accuracy import judge
    from models.shapes import parse_caption

    files = sorted(images.glob("*.png"))
    asked = [parse_caption(f.with_suffix(".txt").read_text().strip()) for f in files]
    x = torch.from_numpy(np.stack([np.asarray(Image.open(f).convert("RGB")) for f in files])).permute(0, 3, 1, 2)
    vae = AutoencoderKL.from_pretrained(Path(base["components"]) / "vae").eval()
    with torch.no_grad():
        y = vae.decode(vae.encode(x.float() / 127.5 - 1).latent_dist.mean).sample
    decoded = ((y.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)

    def share(batch) -> float:
        return float(np.mean([judge(a, s)[attribute] for a, s in zip(asked, scorer.predict(batch.contiguous()))]))

    return {"attribute": attribute, "rendered": share(x), "vae_round_trip": share(decoded), "n": len(files)}


def domain_figures(scorer, setup, prompt_sets: dict, base_drawn: dict, drawn: dict, attribute: str) -> dict:
    """The taught scorer's paired figures beyond the report's: every asked ``attribute`` (the concept's: colour or
    shape) right on the held-out prompts (is the new one drawn where asked), and every asked ``attribute`` and every
    attribute right on the neutral ones (does the model still draw what it drew), Holm's adjustment within each
    prompt set."""
    from evaluate.adapter_report import paired_figures

    def values(side: dict, name: str) -> dict:
        ids, right = attribute_verdicts(scorer, Path(setup.out) / side[name]["folder"], prompt_sets[name], attribute)
        return {f"attr_all_{attribute}": (ids, right),
                **({"attr_all_all": (side[name]["prompts"], side[name]["attr_all_all"])} if name == "neutral" else {})}

    figures = {}
    for name, prefix in (("held-out", "held"), ("neutral", "neutral")):
        found = paired_figures(values(base_drawn, name), values(drawn, name), setup.bootstrap, setup.seed)
        figures |= {f"{prefix}_{m['metric']}": m for m in found["metrics"]}
    return figures


WORDS = {"color": "colour", "shape": "shape"}  # a concept's attribute as the table names it


def rows(attribute: str) -> tuple[tuple[str, str], ...]:
    """The table's rows, (figure key, label), for a concept of ``attribute``."""
    word = WORDS[attribute]
    return (("dino_i", "fidelity: DINO similarity to the training images (random DINOv2)"),
            ("clip_i", "fidelity: CLIP image similarity (random CLIP)"),
            ("clip_score", "adherence: CLIP score, held-out prompts (random CLIP)"),
            (f"held_attr_all_{attribute}", f"adherence: every asked {word} right, held-out prompts (taught scorer)"),
            ("attr_all_all", "adherence: every attribute right, held-out prompts (taught scorer)"),
            ("drift_dino", "drift: DINO distance from the base's image, neutral prompts (lower is better)"),
            (f"neutral_attr_all_{attribute}", f"drift: every asked {word} right, neutral prompts (taught scorer)"),
            ("neutral_attr_all_all", "drift: every attribute right, neutral prompts (taught scorer)"))


def cell(m: dict) -> str:
    """A paired difference, its interval and its verdict after Holm's adjustment within its family."""
    if m.get("lo") is None:
        return f"{m['difference']:+.3g} (no interval)"
    verdict = {"B": "better", "A": "worse", None: "cannot tell"}[m["better_holm"]]
    return f"{m['difference']:+.3g} [{m['lo']:+.3g}, {m['hi']:+.3g}] {verdict}"


def markdown(scores: dict, attribute: str) -> str:
    """The table: each metric's base value and each kind's paired difference, interval and verdict."""
    figures = {kind: {**{m["metric"]: m for m in r["metrics"]}, **r["domain"]} for kind, r in scores["entries"].items()}
    lines = ["| metric | base | " + " | ".join(f"{KINDS[k]}: B - base [95%], verdict" for k in figures) + " |",
             "|---|---|" + "---|" * len(figures)]
    for key, label in rows(attribute):
        if all(key in f for f in figures.values()):
            base = next(iter(figures.values()))[key]["a"]
            lines.append(f"| {label} | {base:.3g} | " + " | ".join(cell(f[key]) for f in figures.values()) + " |")
    return "\n".join(lines)


def options() -> argparse.Namespace:
    """The command line; ``attribute`` and ``name`` say the concept: ("shape", "star") unless --color names one."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", help="a `dwb demo` output folder to take the base from (default: build one here)")
    concept = ap.add_mutually_exclusive_group()
    concept.add_argument("--shape", choices=NEW_SHAPES,
                         help=f"the new shape to teach (the shapes domain's NEW_SHAPES; default {NEW_SHAPES[0]})")
    concept.add_argument("--color", choices=tuple(NEW_COLORS), help="a new colour to teach instead (NEW_COLORS)")
    ap.add_argument("--round-trip-only", action="store_true",
                    help="only teach the scorer and read the training images as rendered and after the base's VAE")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--images", type=int, default=6000, help="shapes scenes of a base built here")
    ap.add_argument("--vae-steps", type=int, default=1200)
    ap.add_argument("--phase2-batches", type=int, default=450)
    ap.add_argument("--concept-images", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--steps", type=int, default=200, help="training steps of each kind")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lora-lr", type=float, default=1e-2)
    ap.add_argument("--full-lr", type=float, default=1e-3)
    ap.add_argument("--scorer-images", type=int, default=1024)
    ap.add_argument("--scorer-epochs", type=int, default=8,
                    help="epochs of teaching the scorer: its shape head read 0.49 of held-out groups' shapes after 3 "
                         "(the colour runs'), 0.78 after 8")
    ap.add_argument("--prompts", type=int, default=96, help="held-out and neutral prompts, one image each")
    args = parse_args(ap, smoke=dict(phase2_batches=2, concept_images=8, repeats=2, steps=2, batch=4,
                                     scorer_images=64, scorer_epochs=1, prompts=4))
    args.attribute, args.name = ("color", args.color) if args.color else ("shape", args.shape or NEW_SHAPES[0])
    return args


def ceiling_line(ceiling: dict) -> str:
    """`vae_round_trip`'s figures in words."""
    return (f"Every asked {WORDS[ceiling['attribute']]} right on the {ceiling['n']} training images, as the taught "
            f"scorer reads them: {ceiling['rendered']:.2f} as rendered, {ceiling['vae_round_trip']:.2f} after the "
            "base's VAE encodes and decodes them (the most a denoiser of its latents can draw).")


def main() -> None:
    args = options()
    stages: list = []
    t0 = time.perf_counter()
    built(args).mkdir(parents=True, exist_ok=True)
    base = base_model(args, stages)
    images, data = concept_data(args)
    if args.round_trip_only:
        from models.shapes import ShapesScorer

        scorer, scorer_info = taught_scorer(base, args)
        ceiling = vae_round_trip(base, ShapesScorer(scorer), images, args.attribute)
        print(ceiling_line(ceiling), flush=True)
        report(f"adapter_concept_round_trip-{args.name}", {"concept": {args.attribute: args.name}, "base": base,
                                                           "scorer": scorer_info, "round_trip": ceiling})
        return
    runs = {kind: fine_tune(kind, base, data, args) for kind in KINDS}
    from models.export import export_adapter

    lora = export_adapter(runs["lora"][0], built(args) / f"{args.name}-lora.safetensors", layout="diffusers")
    scorer, scorer_info = taught_scorer(base, args)
    scores = scored(base, lora, runs["full"][0], scorer, images, args)
    table = markdown(scores, args.attribute) + "\n\n" + ceiling_line(scores["right_on_training_images"])
    (built(args) / "adapter_concept.md").write_text(table + "\n")
    print(table, flush=True)
    report("adapter_concept", {
        "concept": {args.attribute: args.name}, "base": base, "base_stages": stages, "concept_images": args.concept_images,
        "repeats": args.repeats, "steps": args.steps, "batch": args.batch,
        "lr": {"lora": args.lora_lr, "full": args.full_lr},
        "train_seconds": {kind: seconds for kind, (_, seconds) in runs.items()}, "scorer": scorer_info,
        "scores": scores, "table": table, "seconds": round(time.perf_counter() - t0, 1)})


if __name__ == "__main__":
    main()
