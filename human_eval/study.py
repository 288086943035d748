"""A study: the pairs raters compare, the questions they answer, and the images, in one folder.

    STUDY/study.json      prompts, opaque image tokens, pairs, questions, models (server-side only)
    STUDY/images/*.png    every image re-encoded from its pixels (no metadata), named by content hash
    STUDY/votes.sqlite    the default vote store, created by `dwb human-eval serve`

Pairs are matched by prompt and per-prompt image number (the seed index): for every two models and
every (prompt, image_index) both have, one pair. Image *a* is always the earlier model of the two; the
server randomizes which side a rater sees it on. Gold pairs put an image against a degraded image of
another prompt (the known answer is *a* for both questions); repeated pairs show a main pair again
under new tokens, to measure each rater's self-consistency.
"""
from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import os
import random
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from .errors import HumanEvalError
from .images import clean_image, degrade
from .samples import Sample

FORMAT = 1
GOLD_MODEL = "(gold decoy)"  # the label of degraded images in gold pairs; never shown to raters


@dataclass(frozen=True)
class Question:
    id: str
    text: str


# Imagen's DrawBench protocol (Saharia et al. 2022, appendix): two questions, "indifferent" allowed.
QUESTIONS = (
    Question("quality", "Which image is of higher quality?"),
    Question("alignment", "Which image better represents the text caption?"),
)
ANSWERS = ("A", "B", "none")  # as displayed: the left image, the right image, no preference


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str = ""


@dataclass(frozen=True)
class StudyImage:
    model: str
    file: str  # relative to the study folder
    seed: int | None = None
    source: str = ""  # the original file (admin-side only)


@dataclass(frozen=True)
class Pair:
    id: str
    prompt: int  # index into Study.prompts
    image_index: int
    a: str  # image tokens
    b: str
    kind: str = "main"  # main | gold | repeat
    gold: str | None = None  # the known answer of a gold pair ("a")
    repeat_of: str | None = None  # the main pair a repeat shows again


@dataclass
class Study:
    folder: Path
    id: str
    secret: str
    created: str
    models: list[str]
    prompts: list[Prompt]
    images: dict[str, StudyImage]
    pairs: list[Pair]
    questions: tuple[Question, ...] = QUESTIONS
    per_rater: int | None = None
    model_info: dict[str, dict] = field(default_factory=dict)
    by_id: dict[str, Pair] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.by_id = {p.id: p for p in self.pairs}

    @property
    def question_ids(self) -> tuple[str, ...]:
        return tuple(q.id for q in self.questions)

    def models_of(self, pair: Pair) -> tuple[str, str]:
        return self.images[pair.a].model, self.images[pair.b].model

    def order_for(self, rater: str) -> list[str]:
        """The rater's own random order of every pair, the same on every server instance and restart."""
        digest = hmac.new(self.secret.encode(), rater.encode(), hashlib.sha256).digest()
        order = [p.id for p in self.pairs]
        random.Random(int.from_bytes(digest[:8], "big")).shuffle(order)
        return order

    def image_files(self) -> dict[str, Path]:
        return {token: self.folder / image.file for token, image in self.images.items()}

    def save(self) -> Path:
        data = {
            "format": FORMAT, "id": self.id, "secret": self.secret, "created": self.created,
            "questions": [asdict(q) for q in self.questions], "per_rater": self.per_rater,
            "models": self.models, "model_info": self.model_info,
            "prompts": [asdict(p) for p in self.prompts],
            "images": {token: asdict(image) for token, image in self.images.items()},
            "pairs": [asdict(p) for p in self.pairs],
        }
        path = self.folder / "study.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
        return path


def load_study(folder: str | Path) -> Study:
    folder = Path(folder)
    path = folder / "study.json"
    if not path.is_file():
        raise HumanEvalError(f"no study in {folder} (create one with `dwb human-eval create {folder} --samples ...`)")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise HumanEvalError(f"{path}: not valid JSON ({e.msg})") from None
    if data.get("format") != FORMAT:
        raise HumanEvalError(f"{path}: study format {data.get('format')!r}, this version reads {FORMAT}")
    return Study(
        folder=folder, id=data["id"], secret=data["secret"], created=data["created"], models=data["models"],
        prompts=[Prompt(**p) for p in data["prompts"]],
        images={token: StudyImage(**image) for token, image in data["images"].items()},
        pairs=[Pair(**p) for p in data["pairs"]], questions=tuple(Question(**q) for q in data["questions"]),
        per_rater=data.get("per_rater"), model_info=data.get("model_info", {}),
    )


def _token(nbytes: int) -> str:
    return secrets.token_urlsafe(nbytes)


def _prompts_of(samples: list[Sample]) -> tuple[list[Prompt], dict[str, int]]:
    """Unique prompts in prompt_index order (then first appearance), each with the first category given."""
    first: dict[str, tuple[float, int]] = {}
    category: dict[str, str] = {}
    for n, s in enumerate(samples):
        rank = (s.prompt_index if s.prompt_index is not None else float("inf"), n)
        first[s.prompt] = min(first.get(s.prompt, rank), rank)
        if s.category and not category.get(s.prompt):
            category[s.prompt] = s.category
    texts = sorted(first, key=first.__getitem__)
    return [Prompt(t, category.get(t, "")) for t in texts], {t: i for i, t in enumerate(texts)}


def _model_info(samples: list[Sample]) -> dict:
    s = samples[0]
    return {"checkpoint": s.checkpoint, "source": s.source, "images": len(samples), **s.settings}


def build_study(samples: list[Sample], folder: str | Path, *, gold: int = 0, repeats: int = 0,
                per_rater: int | None = None, images_per_prompt: int | None = None, seed: int = 0,
                progress: bool = True) -> tuple[Study, dict]:
    """Write a study folder from samples of two or more models; returns the study and a summary."""
    folder = Path(folder)
    if (folder / "study.json").exists():
        raise HumanEvalError(f"{folder} already holds a study; choose a new folder (its votes refer to these pairs)")
    if images_per_prompt is not None:
        samples = [s for s in samples if s.image_index < images_per_prompt]
    by_model: dict[str, dict[tuple[str, int], Sample]] = {}
    for s in samples:
        by_model.setdefault(s.model, {})
        if s.key in by_model[s.model]:
            raise HumanEvalError(f"two images of model '{s.model}' for prompt {s.prompt!r}, image {s.image_index} "
                                 f"({by_model[s.model][s.key].source} and {s.source}); give each sample set its own label")
        by_model[s.model][s.key] = s
    models = list(by_model)
    if len(models) < 2:
        raise HumanEvalError(f"a study compares two or more models, the samples name {len(models)}: "
                             f"{', '.join(models) or 'none'} (pass another --samples or --folder)")
    if GOLD_MODEL in models:
        raise HumanEvalError(f"'{GOLD_MODEL}' is reserved for gold pairs; rename that model")
    prompts, prompt_index = _prompts_of(samples)
    rng = random.Random(seed)

    images: dict[str, StudyImage] = {}
    sources: dict[str, Path | tuple[Path, int]] = {}  # token -> what to write (a file, or (file, seed) to degrade)

    def add_image(sample: Sample, model: str | None = None, degraded_seed: int | None = None) -> str:
        token = _token(16)
        images[token] = StudyImage(model=model or sample.model, file="", seed=sample.seed, source=str(sample.path))
        sources[token] = (sample.path, degraded_seed) if degraded_seed is not None else sample.path
        return token

    pairs: list[Pair] = []
    counts: dict[str, int] = {}
    for ma, mb in itertools.combinations(models, 2):
        common = sorted(set(by_model[ma]) & set(by_model[mb]), key=lambda k: (prompt_index[k[0]], k[1]))
        if not common:
            raise HumanEvalError(f"models '{ma}' and '{mb}' have no prompt and image_index in common")
        counts[f"{ma} vs {mb}"] = len(common)
        for key in common:
            pairs.append(Pair(id=_token(12), prompt=prompt_index[key[0]], image_index=key[1],
                              a=add_image(by_model[ma][key]), b=add_image(by_model[mb][key])))
    unmatched = {m: sum(1 for k in by_model[m] if all(k not in by_model[o] for o in models if o != m)) for m in models}

    main = list(pairs)
    if repeats:
        if repeats > len(main):
            raise HumanEvalError(f"--repeats {repeats} is more than the {len(main)} pairs")
        for original in rng.sample(main, repeats):
            sa, sb = by_model[images[original.a].model], by_model[images[original.b].model]
            key = (prompts[original.prompt].text, original.image_index)
            pairs.append(Pair(id=_token(12), prompt=original.prompt, image_index=original.image_index,
                              a=add_image(sa[key]), b=add_image(sb[key]), kind="repeat", repeat_of=original.id))
    if gold:
        if len(prompts) < 2:
            raise HumanEvalError("gold pairs need at least two prompts (the decoy shows another prompt)")
        for n in range(gold):
            original = rng.choice(main)
            model = rng.choice([images[original.a].model, images[original.b].model])
            key = (prompts[original.prompt].text, original.image_index)
            good = by_model[model][key]
            others = [s for s in by_model[model].values() if s.prompt != good.prompt]
            unlike = [s for s in others if s.category != good.category] or others
            if not unlike:
                raise HumanEvalError(f"gold pairs need images of model '{model}' for a second prompt")
            decoy = rng.choice(unlike)
            pairs.append(Pair(id=_token(12), prompt=original.prompt, image_index=original.image_index,
                              a=add_image(good), b=add_image(decoy, GOLD_MODEL, degraded_seed=seed * 100003 + n),
                              kind="gold", gold="a"))
    rng.shuffle(pairs)

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "images").mkdir(exist_ok=True)
    written: dict[object, str] = {}
    for token, src in tqdm(sources.items(), desc="images", unit="img", disable=None if progress else True):
        if src not in written:
            try:
                data = degrade(*src) if isinstance(src, tuple) else clean_image(src)
            except (OSError, ValueError) as e:
                raise HumanEvalError(f"cannot read image {src[0] if isinstance(src, tuple) else src}: {e}") from None
            name = f"images/{hashlib.sha256(data).hexdigest()[:24]}.png"
            (folder / name).write_bytes(data)
            written[src] = name
        image = images[token]
        images[token] = StudyImage(model=image.model, file=written[src], seed=image.seed, source=image.source)

    study = Study(
        folder=folder, id=_token(12), secret=secrets.token_hex(32), created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        models=models, prompts=prompts, images=images, pairs=pairs, per_rater=per_rater,
        model_info={m: _model_info(list(by_model[m].values())) for m in models},
    )
    study.save()
    summary = {"models": models, "prompts": len(prompts), "pairs": len(main), "pairs_per_model_pair": counts,
               "gold": gold, "repeats": repeats, "unmatched_images": unmatched, "images_written": len(set(written.values()))}
    return study, summary
