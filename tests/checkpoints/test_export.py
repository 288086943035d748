"""`dwb export` to one original-layout .safetensors: read back by diffusers' own single-file loader to the same
tensors, opened by `dwb` to the same image; and a folder export's model card, read by huggingface_hub."""
import json
import shutil

import numpy as np
import pytest
import torch

from models.checkpoints import find_checkpoint, load_pipeline
from models.generation.images import Settings, generate_images

PROMPT = "two red circles left of a blue square"
SETTINGS = Settings(steps=3, guidance=3.0, width=32, height=32, sampler="DDIM")


def image(pipe, seed: int = 4) -> np.ndarray:
    return generate_images(pipe, [PROMPT], [seed], SETTINGS)[0]


def from_single_file(path, config, dtype=torch.float32):
    """diffusers' own loader, offline, with a diffusers folder for the configs (its weights are not read)."""
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline.from_single_file(str(path), config=str(config), local_files_only=True,
                                                    torch_dtype=dtype, safety_checker=None,
                                                    requires_safety_checker=False)


def assert_same_tensors(pipe, reference: dict[str, dict]) -> None:
    for part, expected in reference.items():
        got = getattr(pipe, part).state_dict()
        assert set(got) == set(expected), part
        different = [k for k in expected if not torch.equal(got[k], expected[k])]
        assert not different, f"{part}: {different[:3]}"


def tensor_bytes(path) -> int:
    """A safetensors file's size less its header (the spec in the metadata holds the tokenizer: 2.2 MB)."""
    data = path.read_bytes()
    return len(data) - 8 - int.from_bytes(data[:8], "little")


def parts(pipe) -> dict[str, dict]:
    return {p: {k: v.clone() for k, v in getattr(pipe, p).state_dict().items()} for p in ("unet", "vae", "text_encoder")}


def test_an_sd2_export_reads_back_bit_identical_in_diffusers_and_opens_to_the_same_image(sd2_folder, tmp_path, dwb):
    from diffusers import StableDiffusionPipeline
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    out = tmp_path / "model.safetensors"
    run = dwb("export", str(sd2_folder), str(out))
    assert run.returncode == 0, run.stderr
    assert f"to {out} and its original config {out.with_suffix('.yaml')}" in run.stdout
    assert out.read_bytes()[8:9] == b"{"  # a safetensors header, not a pickle
    reference = StableDiffusionPipeline.from_pretrained(sd2_folder, safety_checker=None)
    assert_same_tensors(from_single_file(out, sd2_folder), parts(reference))
    original = load_file(out)  # OpenCLIP's 24 blocks, the unused last one as zeros; fused q/k/v
    assert "cond_stage_model.model.transformer.resblocks.2.attn.in_proj_weight" in original
    assert not original["cond_stage_model.model.transformer.resblocks.2.mlp.c_fc.weight"].any()
    assert original["first_stage_model.decoder.mid.attn_1.q.weight"].shape[2:] == (1, 1)
    expected = image(load_pipeline(sd2_folder))
    assert np.array_equal(image(load_pipeline(out)), expected)
    assert expected.std() > 1

    # The original config beside it describes the model to a reader that knows nothing of dwb's metadata
    with safe_open(str(out), "pt") as f:
        spec = json.loads(f.metadata()["dwb.spec"])
    assert spec["prediction_type"] == "v_prediction"
    bare = tmp_path / "bare" / "model.safetensors"
    bare.parent.mkdir()
    save_file(original, str(bare))
    shutil.copy(out.with_suffix(".yaml"), bare.with_suffix(".yaml"))
    from models.checkpoints.single_file import describe_single_file

    assert describe_single_file(bare)["prediction_type"] == "v_prediction"
    assert np.array_equal(image(load_pipeline(bare)), expected)

    half = tmp_path / "half.safetensors"
    assert dwb("export", str(sd2_folder), str(half), "--half").returncode == 0
    halved = load_file(half)
    assert halved.keys() == original.keys()
    assert all(halved[k].dtype == torch.float16 and torch.equal(halved[k], original[k].half()) for k in original)
    assert tensor_bytes(half) * 2 == tensor_bytes(out)
    assert_same_tensors(from_single_file(half, sd2_folder, torch.float16),
                        {p: {k: v.half() for k, v in d.items()} for p, d in parts(reference).items()})


def test_the_tiny_models_ema_export_reads_back_in_diffusers_and_dwb(tiny_run, tmp_path, dwb):
    """The tiny model (8 GroupNorm groups, a run's own tokenizer: more than an original config says) travels
    with its spec in the file's metadata."""
    from models.checkpoints.composer import model_weights, read_checkpoint

    ckpt = tiny_run / "ep0-ba4-rank0.pt"
    out = tmp_path / "tiny.safetensors"
    run = dwb("export", str(ckpt), str(out), "--ema")
    assert run.returncode == 0, run.stderr
    config = tmp_path / "tiny.config"  # written beside the file: configs and tokenizer, no weights
    assert not list(config.rglob("*.safetensors"))
    source = load_pipeline(ckpt, ema=True)
    ema = model_weights(read_checkpoint(ckpt), ema=True)
    raw = model_weights(read_checkpoint(ckpt), ema=False)
    assert not torch.equal(ema["unet.conv_in.weight"], raw["unet.conv_in.weight"])  # the EMA weights were taken
    expected = {p: {k[len(p) + 1:]: v for k, v in ema.items() if k.startswith(p + ".")}
                for p in ("unet", "vae", "text_encoder")}
    assert_same_tensors(from_single_file(out, config), expected)
    assert find_checkpoint(out).kind == "single-file"
    from models.checkpoints import discover

    assert [c.label for c in discover([tmp_path])] == ["tiny.safetensors"]  # the config folder is no checkpoint
    assert np.array_equal(image(load_pipeline(out)), image(source))


@pytest.mark.parametrize("args, message", [
    (["--format", "single-file"], "a single-file export is named NAME.safetensors"),
    (["--latent-scale", "-1"], "a positive number"),
])
def test_export_refusals_are_one_line(tiny_run, tmp_path, dwb, args, message):
    run = dwb("export", str(tiny_run / "ep0-ba2-rank0.pt"), str(tmp_path / "out"), *args)
    assert run.returncode != 0 and message in run.stderr


def test_an_export_is_never_a_pickle_and_never_overwrites(tiny_run, tmp_path, dwb):
    ckpt = str(tiny_run / "ep0-ba2-rank0.pt")
    run = dwb("export", ckpt, str(tmp_path / "model.ckpt"))
    assert run.returncode == 1 and "exports are safetensors only" in run.stderr and len(run.stderr.splitlines()) == 1
    assert not (tmp_path / "model.ckpt").exists()
    kept = tmp_path / "kept.safetensors"
    kept.write_bytes(b"mine")
    run = dwb("export", ckpt, str(kept))
    assert run.returncode == 1 and "exists" in run.stderr and kept.read_bytes() == b"mine"


# ---------------------------------------------------------------------------------------------
# The model card of a folder export


@pytest.fixture(scope="module")
def scored(tiny_run, tmp_path_factory):
    """An evaluate results store and a rated human-eval study that both name the tiny checkpoint by its hash."""
    from evaluate.store import ResultsStore
    from human_eval.analysis import analyze
    from human_eval.report import write_report
    from human_eval.samples import read_manifest
    from human_eval.store import Store, database_url
    from human_eval.study import build_study, load_study
    from models.checkpoints import content_hash

    from ..human_eval.conftest import drawbench, write_samples

    ckpt = tiny_run / "ep0-ba4-rank0.pt"
    ours = content_hash(find_checkpoint(ckpt))
    root = tmp_path_factory.mktemp("scored")
    store = ResultsStore(root / "results")
    base = {"checkpoint": str(ckpt), "step": 4, "sampler": "DPM++ 2M", "steps": 20, "n_images": 64, "status": "ok"}
    store.append_rows([
        {**base, "model": "tiny", "checkpoint_hash": ours, "guidance": 3.0, "fid": 41.237, "fid_lo": 38.01,
         "fid_hi": 44.6, "clip_score": 0.2113, "clip_score_lo": 0.2051, "clip_score_hi": 0.2178},
        {**base, "model": "other", "checkpoint_hash": "0123456789ab", "guidance": 3.0, "fid": 99.0, "fid_lo": 90.0,
         "fid_hi": 108.0}])
    samples = []
    for i, name in enumerate(("tiny", "other")):
        manifest = write_samples(root / name, name, drawbench()[:4], 1, size=8, seed=i)
        lines = [json.loads(line) for line in manifest.read_text().splitlines()]
        manifest.write_text("".join(json.dumps({**line, "checkpoint_hash": ours if name == "tiny" else "0123456789ab"})
                                    + "\n" for line in lines))
        samples += read_manifest(manifest)
    build_study(samples, root / "study", seed=1, progress=False)
    study = load_study(root / "study")
    votes = Store(database_url(root / "study" / "votes.sqlite"), study.id)
    tiny = next(m for m in study.models if m.startswith("tiny"))
    for r, pair in enumerate(p for p in study.pairs if p.kind == "main"):  # every rater prefers the tiny model
        votes.add_rater(f"r{r}")
        votes.show(f"r{r}", pair.id, False)
        votes.vote(f"r{r}", pair.id, "quality", "A" if study.models_of(pair)[0] == tiny else "B", 500)
    results = analyze(study, votes.all_votes(), n_boot=100)
    write_report(study, votes.all_votes(), results, root / "study" / "report")
    votes.close()
    return ckpt, root / "results", root / "study"


def test_a_folder_export_carries_a_model_card_the_hub_reads(scored, tmp_path, dwb):
    from huggingface_hub import ModelCard

    ckpt, results, study = scored
    out = tmp_path / "export"
    run = dwb("export", str(ckpt), str(out), "--ema", "--half", "--results", str(results), "--study", str(study))
    assert run.returncode == 0, run.stderr
    assert (out / "unet" / "diffusion_pytorch_model.fp16.safetensors").is_file()  # diffusers' fp16 variant
    exported, source = load_pipeline(out), load_pipeline(ckpt, ema=True)
    assert all(torch.equal(v, source.unet.state_dict()[k].half().float()) for k, v in exported.unet.state_dict().items())
    card = ModelCard.load(out / "README.md")
    assert (card.data.library_name, card.data.pipeline_tag) == ("diffusers", "text-to-image")
    assert card.data.base_model is None  # the tiny architecture starts from no hub model
    assert "- **prediction type**: v_prediction" in card.text and "EMA weights" in card.text
    assert "Trained for 4 batches" in card.text
    assert "lr 0.003" in card.text  # the run's schedule, from the spec
    assert "| 3.0 | DPM++ 2M | 20 | 64 | 41.24 [38.01, 44.60] | 0.2113 [0.2051, 0.2178] |" in card.text
    assert "99.0" not in card.text  # another checkpoint's row
    report = json.loads((study / "report" / "results.json").read_text())
    [comparison] = [c for c in report["comparisons"] if c["question"] == "quality"]
    won = comparison["wins_a"] if comparison["model_a"].startswith("tiny") else comparison["wins_b"]
    assert won == comparison["votes"] > 0
    row = next(line for line in card.text.splitlines() if "| quality |" in line)
    assert "100" in row.split("|")[4] and f"| {comparison['votes']} |" in row


def test_a_card_names_sd2_base_as_its_base_model():
    from huggingface_hub import ModelCard

    from models.checkpoints import ARCHITECTURES
    from models.export import model_card_text

    spec = {"architecture": "sd2-base", "prediction_type": "epsilon", "resolution": 512,
            "vae": dict(ARCHITECTURES["sd2-base"]["vae"])}
    card = ModelCard(model_card_text(spec, label="run-a", checkpoint_hash="abcdef012345", weights="raw"))
    assert card.data.base_model == "stabilityai/stable-diffusion-2-base"
    assert "does not record its training data" in card.text and "No scores were given" in card.text
