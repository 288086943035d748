"""What the human-preference scores add to evaluation: seconds per image of PickScore, HPSv2.1, ImageReward
and the aesthetic score at their published sizes, against generating that image at 512², side by side in
one process on this machine.

Generation: SD2-base at full size with seeded random weights (``_common.random_sd2_base``: UNet 865.9M,
VAE, OpenCLIP-H text tower), 512², DDIM, guidance 7.5, one batch of ``--images``. A CPU cannot run 25 steps
in a benchmark's time, so the pipeline runs twice, at ``--steps`` and at twice that: the difference is the
time of ``--steps`` steps (UNet, guidance doubling its batch), the rest the fixed cost (text encoder, VAE
decode), and a 25-step image costs fixed + 25 x one step; the ratio at the measured 2 x ``--steps`` steps
is reported beside it.

Scoring: each scorer's own ``__call__`` (its authors' preprocessing, then the model) on the generated
images, with seeded random weights at the published sizes: PickScore a CLIP-H (ViT-H/14 image tower 1,280
wide and 32 deep, text tower 1,024 / 24, in transformers), HPSv2.1 OpenCLIP's ViT-H-14, ImageReward BLIP's
ViT-L/16 (1,024 / 24) with a 12-layer BERT-base cross-attending to it, the aesthetic score CLIP ViT-L/14
(1,024 / 24 and 768 / 12) with its head. One scorer is built at a time (one warm-up call, then timed) and
freed before the next, so memory holds one at once. Weights are random: times, not scores.

CPU: python bench/preference_cost.py [--images 2] [--steps 1]
Smoke: python bench/preference_cost.py --smoke (a tiny checkpoint at 32 px, tiny scorers)
"""
from __future__ import annotations

import argparse
import gc
import time

import numpy as np
import torch

from _common import RUN, fixtures, parse_args, random_sd2_base, report, tiny_checkpoint

SAMPLER, GUIDANCE, STEPS_REPORTED = "DDIM", 7.5, 25
PUBLISHED = {  # (vision width, depth, heads, patch), (text width, depth, heads), projection
    "pickscore": ((1280, 32, 16, 14), (1024, 24, 16), 1024),
    "aesthetic": ((1024, 24, 16, 14), (768, 12, 12), 768),
}
TINY = {"pickscore": ((32, 2, 2, 8), (32, 2, 2), 16), "aesthetic": ((32, 2, 2, 8), (32, 2, 2), 16)}


def clip_model(sizes, tokenizer):
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    (vw, vd, vh, patch), (tw, td, th), proj = sizes
    config = CLIPConfig(text_config=dict(vocab_size=tokenizer.vocab_size, hidden_size=tw, intermediate_size=4 * tw,
                                         num_hidden_layers=td, num_attention_heads=th, max_position_embeddings=77,
                                         eos_token_id=tokenizer.eos_token_id),
                        vision_config=dict(hidden_size=vw, intermediate_size=4 * vw, num_hidden_layers=vd,
                                           num_attention_heads=vh, patch_size=patch, image_size=224),
                        projection_dim=proj)
    processor = CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 224},
                                                                 crop_size={"height": 224, "width": 224}),
                              tokenizer=tokenizer)
    return CLIPModel(config).eval(), processor


def _scorer(cls, **attributes):
    """A scorer of ``cls`` holding the given modules: its ``__call__`` as `dwb evaluate run` calls it."""
    scorer = cls.__new__(cls)
    scorer.device = torch.device("cpu")
    for name, value in attributes.items():
        setattr(scorer, name, value)
    return scorer


def pickscore(tokenizer, sizes):
    from evaluate.scorers.pickscore import PickScorer

    model, processor = clip_model(sizes["pickscore"], tokenizer)
    return _scorer(PickScorer, model=model, processor=processor)


def hps(tokenizer, sizes):
    import open_clip

    from evaluate.scorers.hps import ARCHITECTURE, HpsScorer

    config = open_clip.get_model_config(ARCHITECTURE)
    if RUN.smoke:
        config = {"embed_dim": 32, "vision_cfg": {"image_size": 224, "layers": 2, "width": 160, "head_width": 80,
                                                  "patch_size": 14},
                  "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 1, "layers": 2}}
    return _scorer(HpsScorer, model=open_clip.model.CLIP(**config).eval(), tokenizer=open_clip.get_tokenizer(ARCHITECTURE))


def image_reward(tokenizer, sizes):
    from torchvision import transforms as T
    from transformers import BlipTextConfig, BlipVisionConfig, BertTokenizer
    from transformers.models.blip.modeling_blip import BlipVisionModel
    from transformers.models.blip.modeling_blip_text import BlipTextModel

    from evaluate.scorers.imagereward import CLIP_MEAN, CLIP_STD, ImageRewardScorer
    from evaluate.scorers.preference import Head

    vw, vd, tw, td = (128, 2, 768, 1) if RUN.smoke else (1024, 24, 768, 12)
    vision = BlipVisionModel(BlipVisionConfig(hidden_size=vw, intermediate_size=4 * vw, num_hidden_layers=vd,
                                              num_attention_heads=vw // 64, patch_size=16, image_size=224,
                                              layer_norm_eps=1e-6)).eval()
    text = BlipTextModel(BlipTextConfig(vocab_size=30524, hidden_size=tw, intermediate_size=4 * tw, num_hidden_layers=td,
                                        num_attention_heads=12, encoder_hidden_size=vw), add_pooling_layer=False).eval()
    vocab = RUN.out / "preference-vocab"
    vocab.mkdir(exist_ok=True)
    words = sorted({w for c in CAPTIONS for w in c.lower().split()})
    (vocab / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    transform = T.Compose([T.Resize(224, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(224), T.ToTensor(),
                           T.Normalize(CLIP_MEAN, CLIP_STD)])
    return _scorer(ImageRewardScorer, vision=vision, text=text, head=Head(tw).eval(),
                   tokenizer=BertTokenizer.from_pretrained(vocab), transform=transform)


def aesthetic(tokenizer, sizes):
    from evaluate.scorers.aesthetic import AestheticScorer
    from evaluate.scorers.preference import Head

    model, processor = clip_model(sizes["aesthetic"], tokenizer)
    return _scorer(AestheticScorer, model=model, processor=processor, head=Head(model.config.projection_dim).eval())


CAPTIONS = ["a large red circle above two small blue squares", "three green triangles left of a yellow circle",
            "a white square below two red circles", "two blue triangles right of a green square"]
BUILDERS = {"pickscore": pickscore, "hps": hps, "imagereward": image_reward, "aesthetic": aesthetic}


def generation(pipe, n: int, steps: int, size: int) -> tuple[float, np.ndarray]:
    from models.generation import Settings, generate_images

    settings = Settings(steps=steps, guidance=GUIDANCE, width=size, height=size, sampler=SAMPLER)
    prompts = [CAPTIONS[i % len(CAPTIONS)] for i in range(n)]
    t = time.perf_counter()
    images = generate_images(pipe, prompts, list(range(n)), settings)
    return time.perf_counter() - t, images


def scoring(images: torch.Tensor, captions: list[str], tokenizer) -> dict[str, float]:
    """Seconds per image of each scorer, one built at a time."""
    sizes = TINY if RUN.smoke else PUBLISHED
    out = {}
    for name, build in BUILDERS.items():
        torch.manual_seed(0)
        scorer = build(tokenizer, sizes)
        with torch.no_grad():
            scorer(images[:1], captions[:1])  # warm-up
            t = time.perf_counter()
            scores = scorer(images, captions)
        out[name] = (time.perf_counter() - t) / len(images)
        assert np.isfinite(np.asarray(scores)).all(), name
        del scorer
        gc.collect()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=2, help="images generated in one batch, then scored")
    ap.add_argument("--steps", type=int, default=1, help="the shorter of the two generation runs (the longer: twice)")
    ap.add_argument("--size", type=int, default=512)
    args = parse_args(ap, smoke={"images": 2, "steps": 1, "size": 32})
    from transformers import CLIPTokenizer

    from models.checkpoints import load_pipeline

    data, parts = fixtures()
    tokenizer = CLIPTokenizer.from_pretrained(parts / "tokenizer")
    pipe = load_pipeline(tiny_checkpoint()) if RUN.smoke else random_sd2_base(CAPTIONS * 8)
    generation(pipe, 1, 1, args.size)  # warm-up
    short, _ = generation(pipe, args.images, args.steps, args.size)
    long, images = generation(pipe, args.images, 2 * args.steps, args.size)
    del pipe
    gc.collect()
    per_step = (long - short) / args.steps / args.images
    fixed = short / args.images - args.steps * per_step
    generate_25 = fixed + STEPS_REPORTED * per_step
    batch = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    captions = [CAPTIONS[i % len(CAPTIONS)] for i in range(args.images)]
    per_scorer = scoring(batch, captions, tokenizer)
    total = sum(per_scorer.values())
    report("preference_cost", {
        "command": f"python bench/preference_cost.py --images {args.images} --steps {args.steps} --size {args.size}",
        "size": args.size, "images": args.images, "sampler": SAMPLER, "guidance": GUIDANCE,
        "generate_seconds_per_image": {f"{args.steps} steps": round(short / args.images, 2),
                                       f"{2 * args.steps} steps": round(long / args.images, 2),
                                       "one step": round(per_step, 2), "fixed (text encoder, VAE decode)": round(fixed, 2),
                                       f"{STEPS_REPORTED} steps (fixed + {STEPS_REPORTED} x one step)": round(generate_25, 2)},
        "score_seconds_per_image": {k: round(v, 3) for k, v in per_scorer.items()} | {"all four": round(total, 3)},
        "ratio_to_25_step_generation": {k: round(v / generate_25, 4) for k, v in per_scorer.items()}
                                       | {"all four": round(total / generate_25, 4)},
        f"ratio_to_{2 * args.steps}_step_generation (measured)": round(total / (long / args.images), 4),
    })


if __name__ == "__main__":
    main()
