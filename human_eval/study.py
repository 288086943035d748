"""A study: the pairs raters compare, the questions they answer, and the images, in one folder.

    STUDY/study.json      prompts, opaque image tokens, pairs, questions, models (server-side only)
    STUDY/images/*.png    every image re-encoded from its pixels (no metadata) at the study's one size,
                          named by content hash
    STUDY/votes.sqlite    the default vote store, created by `dwb human-eval serve`

Pairs are matched by prompt identity (the prompt set and prompt index, `Sample.prompt_id`) and
per-prompt image number (the seed index): for every two models and every (prompt, image_index) both
have, one pair. Image *a* is always the earlier model of the two; the server randomizes which side a
rater sees it on. Gold pairs put an image against a degraded image of another prompt, about as large a
file as the real one (the known answer is *a* for both questions); repeated pairs show a main pair
again under new tokens, to measure each rater's self-consistency.
"""
from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import math
import os
import random
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from models.common import load_outside
from models.errors import WorkbenchError

from .errors import HumanEvalError
from .images import clean_image, covariates, degrade, image_size, study_size
from .limits import DEFAULT_MAX_MEGAPIXELS
from .raters import rater_key
from .samples import Sample, with_sampler_key

FORMAT = 1
# An image and its pair take about 700 bytes of study.json: 256 MiB hold some 400,000 images, beyond any study
# we run (a study file is JSON like any other: size and nesting bounded before it is parsed).
MAX_STUDY_BYTES = 256 * 1024 * 1024
GOLD_MODEL = "(gold decoy)"  # the label of degraded images in gold pairs; never shown to raters
ALLOCATIONS = ("uniform", "adaptive")


@dataclass(frozen=True)
class Question:
    id: str
    text: str


# Imagen's DrawBench protocol (Saharia et al. 2022, appendix): two questions, "indifferent" allowed.
QUESTIONS = (
    Question("quality", "Which image is of higher quality?"),
    Question("alignment", "Which image better represents the text caption?"),
)
# A study's tie answers (its `ties` setting): "one", DrawBench's single "no preference", the default and what
# studies made before the setting read as; or "good_bad", GenAI-Arena's "both good" and "both bad", which also say
# whether the prompt was handled well, a tie alone not.
TIES = {"one": ("none",), "good_bad": ("good", "bad")}
ANSWERS = ("A", "B", "none", "good", "bad")  # as displayed: left image, right image, no preference, both good, both bad


@dataclass(frozen=True)
class StudyPrompt:
    text: str
    category: str = ""
    index: int | None = None  # its prompt_index in its prompt set
    prompt_set: str = ""


@dataclass(frozen=True)
class StudyImage:
    model: str
    file: str  # relative to the study folder
    seed: int | None = None
    source: str = ""  # the original file (admin-side only)
    covariates: dict = field(default_factory=dict)  # brightness, saturation, file_bytes, pixels (images.covariates)
    metrics: dict = field(default_factory=dict)  # clip_score, attr_all from the manifest line, where given


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
    prompts: list[StudyPrompt]
    images: dict[str, StudyImage]
    pairs: list[Pair]
    questions: tuple[Question, ...] = QUESTIONS
    per_rater: int | None = None
    model_info: dict[str, dict] = field(default_factory=dict)
    allocation: str = "uniform"  # uniform | adaptive (human_eval.statistics.allocation)
    target_width: float = 0.1  # the stopping rule's interval width
    image_size: tuple[int, int] | None = None  # (width, height) of every image; None in studies made before
    ties: str = "one"  # which tie answers raters get (TIES)
    by_id: dict[str, Pair] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.by_id = {p.id: p for p in self.pairs}
        if self.ties not in TIES:
            raise ValueError(f"ties must be one of {', '.join(TIES)}, not {str(self.ties)[:20]!r}")

    @property
    def answers(self) -> tuple[str, ...]:
        """The answers a rater may give in this study, as displayed: A, B and its tie answers."""
        return ("A", "B", *TIES[self.ties])

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

    def rater_key(self, rater: str) -> str:
        """The key that lets a browser or a link act as `rater` (human_eval.raters)."""
        return rater_key(self.secret, rater)

    def image_files(self) -> dict[str, Path]:
        """Each image token's file, symlinks followed; an entry that leads outside STUDY/images is refused
        (a symlinked or absolute entry served any PNG on the server's disk, and ../../etc/hostname gave a 500)."""
        inside = self.folder.resolve() / "images"
        files = {}
        for token, image in self.images.items():
            path = (self.folder / image.file).resolve()
            if not path.is_relative_to(inside):
                raise HumanEvalError(f"{self.folder / 'study.json'} names image {image.file}, which is {path}, outside "
                                     f"{inside}: a study serves only the images inside it")
            files[token] = path
        return files

    def save(self) -> Path:
        data = {
            "format": FORMAT, "id": self.id, "secret": self.secret, "created": self.created,
            "questions": [asdict(q) for q in self.questions], "per_rater": self.per_rater,
            "models": self.models, "model_info": self.model_info, "allocation": self.allocation,
            "target_width": self.target_width, "image_size": list(self.image_size) if self.image_size else None,
            "ties": self.ties,
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
        data = load_outside(path, str(path), max_bytes=MAX_STUDY_BYTES)
    except WorkbenchError as e:
        raise HumanEvalError(str(e)) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = repr(data.get("format"))[:40] if isinstance(data, dict) else f"(a JSON {type(data).__name__})"
        raise HumanEvalError(f"{path}: study format {found}, this version reads {FORMAT}")
    try:
        return _study_of(folder, data)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise HumanEvalError(f"{path}: not a study this version wrote ({type(e).__name__}: {str(e)[:80]})") from None


def _study_of(folder: Path, data: dict) -> Study:
    """The Study a study file's JSON describes."""
    return Study(
        folder=folder, id=data["id"], secret=data["secret"], created=data["created"], models=data["models"],
        prompts=[StudyPrompt(**p) for p in data["prompts"]],
        images={token: StudyImage(**image) for token, image in data["images"].items()},
        pairs=[Pair(**p) for p in data["pairs"]], questions=tuple(Question(**q) for q in data["questions"]),
        per_rater=data.get("per_rater"),
        model_info={m: with_sampler_key(dict(info)) for m, info in data.get("model_info", {}).items()},
        allocation=data.get("allocation", "uniform"), target_width=data.get("target_width", 0.1),
        image_size=tuple(data["image_size"]) if data.get("image_size") else None, ties=data.get("ties", "one"),
    )


def _token(nbytes: int) -> str:
    return secrets.token_urlsafe(nbytes)


def _by_model(samples: list[Sample]) -> dict[str, dict[tuple, Sample]]:
    """Each model's samples by pairing key; a second image for the same key is refused."""
    by_model: dict[str, dict[tuple, Sample]] = {}
    for s in samples:
        mine = by_model.setdefault(s.model, {})
        if s.key in mine:
            raise HumanEvalError(f"two images of model '{s.model}' for {s.describe()}, image {s.image_index} "
                                 f"({mine[s.key].source} and {s.source}); give each sample set its own label")
        mine[s.key] = s
    return by_model


def _prompts_of(samples: list[Sample]) -> tuple[list[StudyPrompt], dict[tuple, int]]:
    """One StudyPrompt per prompt identity in prompt_index order (then first appearance); texts must agree."""
    first: dict[tuple, tuple[float, int]] = {}
    seen: dict[tuple, Sample] = {}
    category: dict[tuple, str] = {}
    for n, s in enumerate(samples):
        pid = s.prompt_id
        if pid in seen and seen[pid].prompt != s.prompt:
            raise HumanEvalError(f"prompt {s.prompt_index} of prompt set {s.prompt_set or '(unnamed)'} reads "
                                 f"{seen[pid].prompt!r} in {seen[pid].source} but {s.prompt!r} in {s.source}: "
                                 "these sample sets were not made from the same prompts")
        seen.setdefault(pid, s)
        rank = (s.prompt_index if s.prompt_index is not None else float("inf"), n)
        first[pid] = min(first.get(pid, rank), rank)
        if s.category and not category.get(pid):
            category[pid] = s.category
    ids = sorted(first, key=first.__getitem__)
    prompts = [StudyPrompt(seen[p].prompt, category.get(p, ""), seen[p].prompt_index, seen[p].prompt_set) for p in ids]
    return prompts, {p: i for i, p in enumerate(ids)}


def _no_common_prompt(ma: str, mb: str, by_model: dict[str, dict[tuple, Sample]]) -> HumanEvalError:
    sets = [{s.prompt_set or "(none)" for s in by_model[m].values()} for m in (ma, mb)]
    why = f" (prompt sets {', '.join(sorted(sets[0]))} and {', '.join(sorted(sets[1]))})" if sets[0] != sets[1] else ""
    return HumanEvalError(f"models '{ma}' and '{mb}' have no prompt and image_index in common{why}")


def _model_info(samples: list[Sample]) -> dict:
    s = samples[0]
    hashes = sorted({x.checkpoint_hash for x in samples if x.checkpoint_hash})
    return {"checkpoint": s.checkpoint, "checkpoint_hash": ",".join(hashes), "source": s.source, "images": len(samples),
            **s.settings}


def _source_paths(src: tuple) -> tuple:
    """The files a study image is made from: a sample's, or a decoy's sample and the real image it stands against."""
    return (src[1],) if src[0] == "clean" else (src[1], src[3])


class _Images:
    """The study's image tokens and what each is made from: a sample's file, or a gold decoy of one."""

    def __init__(self):
        self.images: dict[str, StudyImage] = {}
        self.sources: dict[str, tuple] = {}  # token -> ("clean", path) | ("decoy", path, seed, real path, size ratio)

    def add(self, sample: Sample, model: str | None = None, decoy: tuple | None = None) -> str:
        token = _token(16)
        self.images[token] = StudyImage(model=model or sample.model, file="", seed=sample.seed, source=str(sample.path),
                                        metrics=dict(sample.metrics) if decoy is None else {})
        self.sources[token] = ("clean", sample.path) if decoy is None else ("decoy", sample.path, *decoy)
        return token

    def shown_sizes(self, max_megapixels: float) -> list[tuple[int, int]]:
        """The (width, height) of the images shown as they are (decoys are made at the study's size), from their
        headers. Every file an image is made from, decoys' sources too, is checked first: one over
        `max_megapixels` is a one-line error naming it, before any image is decoded."""
        sizes = {}
        for path in sorted({path for src in self.sources.values() for path in _source_paths(src)}):
            try:
                sizes[path] = image_size(path, max_megapixels)
            except (OSError, ValueError) as e:
                raise HumanEvalError(f"cannot use image {path}: {e}") from None
        return [sizes[src[1]] for src in self.sources.values() if src[0] == "clean"]

    def write(self, folder: Path, size: tuple[int, int], progress: bool, max_megapixels: float) -> int:
        """Encode every image at `size` into `folder/images` (real ones first: decoys take their file size);
        returns the number of files."""
        images_folder(folder).mkdir(parents=True, exist_ok=True)
        clean: dict[Path, bytes] = {}
        written: dict[tuple, tuple[str, dict]] = {}
        order = sorted(self.sources, key=lambda t: self.sources[t][0] != "clean")
        for token in tqdm(order, desc="images", unit="img", disable=None if progress else True):
            src = self.sources[token]
            if src not in written:
                try:
                    if src[0] == "clean":
                        data = clean[src[1]] = clean.get(src[1]) or clean_image(src[1], size, max_megapixels)
                    else:
                        real = clean.get(src[3]) or clean_image(src[3], size, max_megapixels)
                        data = degrade(src[1], src[2], round(len(real) * src[4]), size, max_megapixels)
                except (OSError, ValueError) as e:
                    raise HumanEvalError(f"cannot read image {src[1]}: {e}") from None
                name = f"images/{hashlib.sha256(data).hexdigest()[:24]}.png"
                _write_new(folder / name, data)
                written[src] = (name, covariates(data))
            image = self.images[token]
            name, cov = written[src]
            self.images[token] = StudyImage(model=image.model, file=name, seed=image.seed, source=image.source,
                                            covariates=cov, metrics=image.metrics)
        return len({name for name, _ in written.values()})


def images_folder(folder: Path) -> Path:
    """STUDY/images, refused if it is a link: the study's images are written inside the study, never elsewhere."""
    images = folder / "images"
    if images.is_symlink():
        raise HumanEvalError(f"{images} is a link to {images.resolve()}: a study keeps its images inside its own folder "
                             "(remove the link or choose a new folder)")
    return images


def _write_new(path: Path, data: bytes) -> None:
    """`data` into `path`, never through a link that is already there."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        raise HumanEvalError(f"cannot write {path}: {e.strerror} (a link where a study image goes?)") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _main_pairs(models: list[str], by_model: dict, prompt_index: dict, images: _Images) -> tuple[list[Pair], dict]:
    pairs, counts = [], {}
    for ma, mb in itertools.combinations(models, 2):
        common = sorted(set(by_model[ma]) & set(by_model[mb]), key=lambda k: (prompt_index[k[0]], k[1]))
        if not common:
            raise _no_common_prompt(ma, mb, by_model)
        counts[f"{ma} vs {mb}"] = len(common)
        for key in common:
            pairs.append(Pair(id=_token(12), prompt=prompt_index[key[0]], image_index=key[1],
                              a=images.add(by_model[ma][key]), b=images.add(by_model[mb][key])))
    return pairs, counts


def _repeat_pairs(main: list[Pair], n: int, by_model: dict, keys: dict[str, tuple], images: _Images,
                  rng: random.Random) -> list[Pair]:
    if n > len(main):
        raise HumanEvalError(f"--repeats {n} is more than the {len(main)} pairs")
    pairs = []
    for original in rng.sample(main, n):
        ma, mb = (images.images[t].model for t in (original.a, original.b))
        key = keys[original.id]
        pairs.append(Pair(id=_token(12), prompt=original.prompt, image_index=original.image_index,
                          a=images.add(by_model[ma][key]), b=images.add(by_model[mb][key]), kind="repeat",
                          repeat_of=original.id))
    return pairs


def _gold_pairs(main: list[Pair], n: int, by_model: dict, keys: dict[str, tuple], images: _Images,
                rng: random.Random, seed: int) -> list[Pair]:
    """Real images against degraded images of another prompt, half the decoys a little larger, half smaller."""
    sides = [(-1) ** k for k in range(n)]
    rng.shuffle(sides)
    pairs = []
    for k in range(n):
        original = rng.choice(main)
        model = rng.choice([images.images[original.a].model, images.images[original.b].model])
        good = by_model[model][keys[original.id]]
        others = [s for s in by_model[model].values() if s.prompt_id != good.prompt_id]
        unlike = [s for s in others if s.category != good.category] or others
        if not unlike:
            raise HumanEvalError(f"gold pairs need images of model '{model}' for a second prompt")
        ratio = math.exp(sides[k] * rng.uniform(0.03, 0.15))  # the decoy's file size against the real image's
        decoy = images.add(rng.choice(unlike), GOLD_MODEL, decoy=(seed * 100003 + k, good.path, ratio))
        pairs.append(Pair(id=_token(12), prompt=original.prompt, image_index=original.image_index, a=images.add(good),
                          b=decoy, kind="gold", gold="a"))
    return pairs


def build_study(samples: list[Sample], folder: str | Path, *, gold: int = 0, repeats: int = 0,
                per_rater: int | None = None, images_per_prompt: int | None = None, seed: int = 0,
                allocation: str = "uniform", target_width: float = 0.1, image_size: tuple[int, int] | None = None,
                max_megapixels: float = DEFAULT_MAX_MEGAPIXELS, ties: str = "one",
                progress: bool = True) -> tuple[Study, dict]:
    """Write a study folder from samples of two or more models; returns the study and a summary.

    Every image is brought to `image_size` (width, height), by default the largest of the study's images shrunk
    to fit 1024 x 1024 (`images.study_size`); an image of more than `max_megapixels` is refused before any is
    decoded."""
    folder = Path(folder)
    if (folder / "study.json").exists():
        raise HumanEvalError(f"{folder} already holds a study; choose a new folder (its votes refer to these pairs)")
    if allocation not in ALLOCATIONS:
        raise HumanEvalError(f"allocation must be one of {', '.join(ALLOCATIONS)}, got {allocation!r}")
    if ties not in TIES:
        raise HumanEvalError(f"ties must be one of {', '.join(TIES)}, got {ties!r}")
    if images_per_prompt is not None:
        samples = [s for s in samples if s.image_index < images_per_prompt]
    by_model = _by_model(samples)
    models = list(by_model)
    if len(models) < 2:
        raise HumanEvalError(f"a study compares two or more models, the samples name {len(models)}: "
                             f"{', '.join(models) or 'none'} (pass another --samples or --folder)")
    if GOLD_MODEL in models:
        raise HumanEvalError(f"'{GOLD_MODEL}' is reserved for gold pairs; rename that model")
    prompts, prompt_index = _prompts_of(samples)
    if gold and len(prompts) < 2:
        raise HumanEvalError("gold pairs need at least two prompts (the decoy shows another prompt)")
    rng = random.Random(seed)
    images = _Images()
    main, counts = _main_pairs(models, by_model, prompt_index, images)
    ids = {i: pid for pid, i in prompt_index.items()}
    keys = {p.id: (ids[p.prompt], p.image_index) for p in main}
    pairs = main + _repeat_pairs(main, repeats, by_model, keys, images, rng) if repeats else list(main)
    if gold:
        pairs += _gold_pairs(main, gold, by_model, keys, images, rng, seed)
    rng.shuffle(pairs)
    unmatched = {m: sum(1 for k in by_model[m] if all(k not in by_model[o] for o in models if o != m)) for m in models}
    sizes = images.shown_sizes(max_megapixels)
    size = image_size or study_size(sizes)
    files = images.write(folder, size, progress, max_megapixels)
    study = Study(
        folder=folder, id=_token(12), secret=secrets.token_hex(32), created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        models=models, prompts=prompts, images=images.images, pairs=pairs, per_rater=per_rater,
        model_info={m: _model_info(list(by_model[m].values())) for m in models}, allocation=allocation,
        target_width=target_width, image_size=size, ties=ties,
    )
    study.save()
    summary = {"models": models, "prompts": len(prompts), "pairs": len(main), "pairs_per_model_pair": counts,
               "gold": gold, "repeats": repeats, "unmatched_images": unmatched, "images_written": files,
               "image_size": size}
    return study, summary
