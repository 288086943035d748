"""AUTOMATIC1111's prompt weighting through compel: A1111's reading of brackets, escapes and BREAK; a weighted prompt
draws what plain diffusers draws from compel's own embeddings of the translated prompt (SD 2, and SDXL with both
towers and the pooled output); an unweighted prompt draws what it drew before; the families compel cannot condition
and the weightings past the bounds are refused in one line; the PNG keeps the prompt as typed."""
from __future__ import annotations

import diffusers
import numpy as np
import pytest
import torch
from compel import Compel, ReturnedEmbeddingsType
from PIL import Image

from models.errors import WorkbenchError
from models.families import family_named
from models.generation import (MAX_PROMPT_WEIGHT, ImageRecord, Settings, check_prompt_weights, generate_images,
                               parse_parameters, plain_prompt, to_compel, weighted_parts)
from models.generation.samplers import make_sampler

from .checkpoints.fixtures import reduced_pipeline

SEEDS, SIDE = [3], 32
TYPED = "a (red:1.3) circle [above] a ((blue)) square BREAK small"
# the same prompt written by hand in compel's syntax: (word)WEIGHT, and BREAK's chunks joined by .and()
BY_HAND = '("a (red)1.3 circle (above)0.9090909090909091 a (blue)1.2100000000000002 square", "small").and()'


@pytest.fixture(scope="module")
def pipes(family_folders) -> dict:
    sdxl = diffusers.DiffusionPipeline.from_pretrained(family_folders["sdxl"])
    return {"sd2": reduced_pipeline("sd2", seed=2), "sdxl": sdxl}


def settings(negative: str = "", **more) -> Settings:
    return Settings(steps=2, guidance=4.0, width=SIDE, height=SIDE, sampler="Euler", negative_prompt=negative,
                    prompt_weighting=True, **more)


def compel_of(pipe, name: str) -> Compel:
    """compel over the pipeline's towers, as its documentation builds it for SD 1/2 and for SDXL."""
    if name == "sd2":
        return Compel(tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, truncate_long_prompts=False)
    return Compel(tokenizer=[pipe.tokenizer, pipe.tokenizer_2], text_encoder=[pipe.text_encoder, pipe.text_encoder_2],
                  returned_embeddings_type=ReturnedEmbeddingsType.PENULTIMATE_HIDDEN_STATES_NON_NORMALIZED,
                  requires_pooled=[False, True], truncate_long_prompts=False)


def plain_diffusers(pipe, **text) -> np.ndarray:
    run = type(pipe)(**pipe.components)
    run.scheduler = make_sampler("Euler", pipe.scheduler.config)
    run.set_progress_bar_config(disable=True)
    images = run(**text, num_inference_steps=2, guidance_scale=4.0, width=SIDE, height=SIDE, output_type="np",
                 generator=[torch.Generator("cpu").manual_seed(s) for s in SEEDS]).images
    return (images * 255).round().astype(np.uint8)


def test_a1111s_brackets_escapes_and_break_read_as_a1111_reads_them():
    assert weighted_parts("(word)") == [[("word", 1.1)]]
    assert weighted_parts("[word]") == [[("word", 1 / 1.1)]]
    assert weighted_parts("a ((b:1.5) c)") == [[("a ", 1.0), ("b", 1.5 * 1.1), (" c", 1.1)]]
    assert weighted_parts(r"\(x\) (y:2)") == [[("(x) ", 1.0), ("y", 2.0)]]
    assert weighted_parts("one BREAK (two") == [[("one", 1.0)], [("two", 1.1)]]
    assert weighted_parts("smiley :)") == [[("smiley :)", 1.0)]]  # a closing bracket with none open is text
    assert to_compel(TYPED) == BY_HAND
    assert plain_prompt("a [(cat)] b") == "a cat b" and plain_prompt("a cat, 3:2") == "a cat, 3:2"


@pytest.mark.parametrize("name, negative", [("sd2", "(blurry:1.2) frame"), ("sdxl", "[blurry]")])
def test_a_weighted_prompt_draws_compels_embeddings_in_plain_diffusers(name, negative, pipes):
    pipe = pipes[name]
    drawn = generate_images(pipe, [TYPED], SEEDS, settings(negative))
    compel = compel_of(pipe, name)
    if name == "sd2":
        positive, negative_embeds = compel([BY_HAND]), compel([to_compel(negative)])
        positive, negative_embeds = compel.pad_conditioning_tensors_to_same_length([positive, negative_embeds])
        text = dict(prompt_embeds=positive, negative_prompt_embeds=negative_embeds)
    else:
        (positive, pooled) = compel([BY_HAND])
        text = dict(prompt_embeds=positive, pooled_prompt_embeds=pooled)
        if negative:  # (an empty one is SDXL's zeros, force_zeros_for_empty_prompt, left to the pipeline)
            negative_embeds, negative_pooled = compel(["(blurry)0.9090909090909091"])
            text["prompt_embeds"], text["negative_prompt_embeds"] = compel.pad_conditioning_tensors_to_same_length(
                [positive, negative_embeds])
            text["negative_pooled_prompt_embeds"] = negative_pooled
    assert positive.shape[1] == 2 * 77  # BREAK: a chunk of its own
    assert np.array_equal(drawn, plain_diffusers(pipe, **text))
    if name == "sd2":  # the weights do something
        unweighted = generate_images(pipe, ["a red circle above a blue square small"], SEEDS, settings(negative))
        assert not np.array_equal(drawn, unweighted)


def test_an_unweighted_prompt_draws_what_it_drew_before(pipes):
    pipe = pipes["sd2"]
    assert plain_prompt("a red circle, 3:2 :)") == "a red circle, 3:2 :)"  # no weighting syntax: as typed
    drawn = generate_images(pipe, ["a [(red)] circle"], SEEDS, settings("blurry"))  # weighs 1.1 / 1.1 = 1
    assert np.array_equal(drawn, plain_diffusers(pipe, prompt=["a red circle"], negative_prompt=["blurry"]))
    # without prompt_weighting (prompt sets, evaluate, previews) the text is the text, brackets and all
    literal = generate_images(pipe, ["a [(red)] circle"], SEEDS, Settings(**{**settings("blurry").__dict__,
                                                                             "prompt_weighting": False}))
    assert np.array_equal(literal, plain_diffusers(pipe, prompt=["a [(red)] circle"], negative_prompt=["blurry"]))


def test_families_compel_cannot_condition_refuse_a_weighted_prompt_naming_the_family(dwb, family_folders, tmp_path):
    for name in ("sd3", "flux"):
        family = family_named(name)
        assert not family.takes_prompt_weights
        check_prompt_weights(family, ["a red circle :)", r"a \(quoted\) square", ""])  # unweighted: drawn as ever
        with pytest.raises(WorkbenchError, match=f"^{family.label} takes no prompt weighting"):
            check_prompt_weights(family, ["a (red:1.2) circle"])
    result = dwb("sample", str(family_folders["flux-dev"]), str(tmp_path / "out.png"), "--prompt", "a [red] circle",
                 "--seeds", "1", "--steps", "1", "--size", str(SIDE))
    assert result.returncode != 0 and "Flux.1 takes no prompt weighting" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out.png").exists()


@pytest.mark.parametrize("prompt, why", [
    (f"a (cat:{MAX_PROMPT_WEIGHT + 1:g})", "outside 0 to 100"),
    ("a (cat:1e400)", "outside 0 to 100"),
    ("a (cat:-1)", "outside 0 to 100"),
    ("(" * 17 + "cat", "nest more than 16 deep"),
    ("(((((((((((((((cat:90)))))))))))))", "multiplies to"),
    ("C++ (code:1.2)", "compel's own syntax"),
])
def test_a_weighting_past_the_bounds_is_refused_in_one_line(prompt, why):
    with pytest.raises(WorkbenchError, match=why) as caught:
        check_prompt_weights(family_named("sd2"), [prompt])
    assert "\n" not in str(caught.value)


def test_a_weighted_prompt_too_long_is_refused_in_one_line(pipes):
    long = "(circle:1.1) " + "red circle above blue square " * 120  # about 600 tokens: past 8 chunks of 75
    with pytest.raises(WorkbenchError, match="chunks of 75 tokens; a weighted prompt takes at most 8"):
        generate_images(pipes["sd2"], [long], SEEDS[:1], settings())


def test_the_png_keeps_the_prompt_as_typed(dwb, sd2_folder, tmp_path):
    out = tmp_path / "grid.png"
    result = dwb("sample", str(sd2_folder), str(out), "--prompt", TYPED, "--negative-prompt", "[blurry]",
                 "--seeds", "1", "--steps", "1", "--size", str(SIDE))
    assert result.returncode == 0, result.stderr
    parsed = parse_parameters(Image.open(out).info["parameters"])
    assert parsed["prompt"] == TYPED and parsed["negative_prompt"] == "[blurry]"
    record = ImageRecord.of(settings("[blurry]"), TYPED, 3, (SIDE, SIDE), "Euler", "tiny", "ab" * 5, "stored")
    assert ImageRecord.from_chunk(record.pnginfo()["dwb"]).prompt == TYPED
