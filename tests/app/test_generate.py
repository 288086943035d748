"""Generation without Gradio: validation messages, samplers, per-image seeds, stopping, PNG parameters."""
import json
import time

import numpy as np
import pytest
import torch
from PIL import Image

from app.generate import GenerationParams, Limits, Stopped, generate, record_of, validate
from models.errors import WorkbenchError
from models.generation.png import parse_parameters, save_png
from models.generation.defaults import DEFAULT_SAMPLER
from models.generation.samplers import SAMPLERS, make_sampler, sampler_name

LIMITS = Limits(max_steps=150, max_size=1024, max_batch=8)


def params(**kw) -> GenerationParams:
    base = dict(prompt="two blue squares", negative_prompt="", sampler=DEFAULT_SAMPLER, steps=4, guidance=5.0,
                width=16, height=16, seed=3, batch_size=1)
    return GenerationParams(**{**base, **kw})


def pixels(images) -> np.ndarray:
    return np.stack([np.asarray(i, dtype=np.int16) for i in images])  # (N, H, W, 3)


@pytest.mark.parametrize("change, message", [
    (dict(steps=0), "steps must be between 1 and 150, got 0"),
    (dict(steps=151), "steps must be between 1 and 150, got 151"),
    (dict(steps=2.5), "steps must be a whole number"),
    (dict(width=20), "width must be a multiple of 8, got 20"),
    (dict(height=1032), "height must be between 16 and 1024, got 1032"),
    (dict(width=8), "width must be between 16 and 1024, got 8"),
    (dict(sampler="Karras 9000"), "unknown sampler 'Karras 9000'; choose one of: DDIM, Euler"),
    (dict(prompt="   "), "the prompt is empty"),
    (dict(guidance=-1), "guidance scale must be between 0 and 30"),
    (dict(guidance=float("nan")), "guidance scale must be between 0 and 30"),
    (dict(batch_size=9), "batch size must be between 1 and 8, got 9"),
    (dict(seed=-2), "seed must be between -1 and 4294967295"),
    (dict(seed=2**32 - 2, batch_size=4), "seed + batch size - 1 must be at most 4294967295"),
    (dict(steps="ten"), "steps must be a whole number, got 'ten'"),
])
def test_bad_parameters_get_a_one_line_message(change, message):
    with pytest.raises(WorkbenchError) as e:
        validate(params(**change), LIMITS)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_valid_parameters_are_normalised_and_seed_minus_one_is_drawn():
    ok = validate(params(steps=30.0, width=1024.0, height=16, guidance=0, batch_size=8, seed=2**32 - 8), LIMITS)
    assert (ok.steps, ok.width, ok.batch_size) == (30, 1024, 8) and isinstance(ok.steps, int)
    assert ok.seeds() == [2**32 - 8 + i for i in range(8)]
    drawn = {validate(params(seed=-1, batch_size=8), LIMITS).seed for _ in range(20)}
    assert len(drawn) > 1 and all(0 <= s <= 2**32 - 8 for s in drawn)


def test_samplers_come_from_the_pipeline_config(pipe):
    base = pipe.scheduler.config
    # The workbench's own default sampler, named as the app names it.
    assert sampler_name(pipe.scheduler) == DEFAULT_SAMPLER == "DPM++ 2M"
    assert dict(make_sampler(DEFAULT_SAMPLER, base).config) == dict(base)
    assert base.timestep_spacing == "leading" and base.steps_offset == 1  # SD2's spacing carries over
    for name in SAMPLERS:
        s = make_sampler(name, base)
        assert s.config.prediction_type == base.prediction_type and s.config.beta_end == base.beta_end
        assert sampler_name(s) == name  # the name written into manifests and PNG text
    assert make_sampler("DPM++ 2M Karras", base).config.use_karras_sigmas
    assert not make_sampler("DPM++ 2M", base).config.use_karras_sigmas
    assert type(make_sampler("Euler a", base)).__name__ == "EulerAncestralDiscreteScheduler"
    assert {"DDIM", "Euler", "Euler a", "DPM++ 2M", "DPM++ 2M Karras", "UniPC", "PNDM"} <= set(SAMPLERS)


def test_every_sampler_runs_and_samplers_differ(pipe):
    images = {}
    for name in SAMPLERS:
        images[name] = pixels(generate(pipe, validate(params(sampler=name, steps=3), LIMITS)))
        assert images[name].shape == (1, 16, 16, 3), name
    assert len({v.tobytes() for v in images.values()}) >= len(SAMPLERS) - 2  # some may coincide at 3 steps
    again = pixels(generate(pipe, validate(params(sampler="Euler a", steps=3), LIMITS)))
    assert np.array_equal(again, images["Euler a"])  # ancestral noise comes from the seeded generators too
    assert sampler_name(pipe.scheduler) == DEFAULT_SAMPLER  # the cached pipeline was left as it was


def test_default_sampler_equals_a_plain_pipeline_call(pipe):
    p = validate(params(steps=5, negative_prompt="red", seed=21, batch_size=2), LIMITS)
    gens = [torch.Generator().manual_seed(s) for s in (21, 22)]
    ref = pipe(["two blue squares"] * 2, negative_prompt=["red"] * 2, num_inference_steps=5, guidance_scale=5.0,
               width=16, height=16, generator=gens, output_type="pil").images
    assert np.array_equal(pixels(generate(pipe, p)), pixels(ref))


def test_image_i_of_a_batch_is_the_image_of_seed_plus_i_alone(pipe):
    batch = pixels(generate(pipe, validate(params(sampler="Euler a", steps=6, seed=40, batch_size=3), LIMITS)))
    alone = np.concatenate([pixels(generate(pipe, validate(params(sampler="Euler a", steps=6, seed=40 + i), LIMITS)))
                            for i in range(3)])
    diff = np.abs(batch - alone)
    # the same noise and the same steps: equal up to float rounding in batched kernels (a level, rarely)
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01
    other = pixels(generate(pipe, validate(params(sampler="Euler a", steps=6, seed=43), LIMITS)))
    moved = np.abs(other[0].astype(int) - alone[0])
    assert (moved > 1).mean() > 0.05, moved.mean()  # a different seed is a different image, well past rounding


def test_stop_ends_the_call_after_the_current_step(pipe):
    seen = []
    with pytest.raises(Stopped, match="stopped after 3 of 40 steps"):
        generate(pipe, validate(params(steps=40), LIMITS), on_step=lambda done, total: seen.append((done, total)),
                 should_stop=lambda: len(seen) >= 2)
    assert seen == [(1, 40), (2, 40)]


def test_png_parameters_round_trip(tmp_path):
    p = validate(params(prompt='a "red", circle: left\nof a square', negative_prompt="blue, green", steps=30,
                        guidance=7.5, width=24, height=32, seed=100, batch_size=3), LIMITS)
    record = record_of(p, 2, "runs/a, b/ep0-ba4-rank0.pt", "ab" * 6, "ema")
    path = tmp_path / "x.png"
    save_png(Image.new("RGB", (24, 32)), path, record)
    with Image.open(path) as im:
        text, data = im.text["parameters"], json.loads(im.text["dwb"])
    parsed = parse_parameters(text)
    assert parsed["prompt"] == 'a "red", circle: left of a square' and parsed["negative_prompt"] == "blue, green"
    assert data["prompt"] == 'a "red", circle: left\nof a square'  # the exact prompt is in the record
    assert parsed["Seed"] == "102" and parsed["Steps"] == "30" and parsed["Sampler"] == "DPM++ 2M"
    assert parsed["CFG scale"] == "7.5" and parsed["Size"] == "24x32" and parsed["Model hash"] == "ab" * 6
    assert parsed["Model"] == "runs/a, b/ep0-ba4-rank0.pt" and parsed["Weights"] == "EMA"
    assert data["seed"] == 102 and data["checkpoint_hash"] == "ab" * 6 and data["width"] == 24


A1111_QUOTED = ('two cats\nNegative prompt: dogs, "birds"\nSteps: 20, Sampler: Euler a, CFG scale: 7, Seed: 5, '
                'Size: 512x512, Lora hashes: "add_detail: 7c6bad76eb54, x: 1", Model: "a, b: c", Version: v1.9.4')


def test_parameters_of_automatic1111_are_read_key_by_key():
    parsed = parse_parameters(A1111_QUOTED)
    assert parsed["prompt"] == "two cats" and parsed["negative_prompt"] == 'dogs, "birds"'
    assert (parsed["Steps"], parsed["Sampler"], parsed["CFG scale"], parsed["Seed"], parsed["Size"]) == (
        "20", "Euler a", "7", "5", "512x512")
    assert parsed["Lora hashes"] == "add_detail: 7c6bad76eb54, x: 1" and parsed["Model"] == "a, b: c"
    assert parsed["Version"] == "v1.9.4"


@pytest.mark.parametrize("settings", [
    " " * 2400,  # "p\n" + 2,400 spaces took 54 s under the backtracking pattern, holding the GIL
    " " * 1_000_000,
    "a" * 1_000_000,
    "a " * 500_000,
    "a:" * 500_000,
    'a: "' + "\\x" * 500_000,
    "a: " + '"' * 1_000_000,
    ", " * 500_000,
])
def test_parameters_are_read_in_linear_time_whatever_the_text(settings):
    t0 = time.perf_counter()
    parse_parameters("p\n" + settings)
    assert time.perf_counter() - t0 < 1.0  # 1 MB, the largest text chunk PIL reads: milliseconds when linear


def test_no_prompt_can_add_lines_to_the_parameters_text():
    record = record_of(validate(params(prompt="a red circle\nNegative prompt: blue square",
                                       negative_prompt="green\r\nSteps: 99, Seed: 1", steps=4, seed=3), LIMITS),
                       0, "tiny", "ab" * 6, "ema")
    parsed = parse_parameters(record.parameters())
    assert parsed["prompt"] == "a red circle Negative prompt: blue square"
    assert parsed["negative_prompt"] == "green Steps: 99, Seed: 1"
    assert (parsed["Steps"], parsed["Seed"]) == ("4", "3")


def test_line_breaks_in_a_prompt_tokenize_as_the_spaces_the_parameters_text_has(pipe, tmp_path):
    """CLIP's tokenizer reads every run of whitespace as one space: writing a prompt's line breaks as spaces
    makes the same image (SD2's tokenizer, built from the CLIP vocabulary, and the tiny one)."""
    from transformers import CLIPTokenizer

    from models.checkpoints.clip_bpe import write_clip_tokenizer
    from models.generation import as_one_line

    sd2 = CLIPTokenizer.from_pretrained(write_clip_tokenizer(tmp_path, pad_token="!"))
    for prompt in ("a red circle\nNegative prompt: blue square", "two\r\nblue \n\n squares\n", "a\u2028b\u2029c",
                   "\rthree yellow triangles"):
        assert as_one_line(prompt) != prompt
        for tokenizer in (sd2, pipe.tokenizer):
            assert tokenizer(prompt).input_ids == tokenizer(as_one_line(prompt)).input_ids, (prompt, tokenizer)


def test_work_is_counted_in_pixel_steps_and_ordinary_sd2_requests_fit_the_defaults():
    from app.generate import LimitError, check_client, pixel_steps
    from app.xyz import parse_axis, plan

    defaults = Limits()
    ordinary = validate(params(width=512, height=512, steps=50, batch_size=4), defaults)  # SD2's usual request
    assert pixel_steps(ordinary) == 512 * 512 * 50 * 4
    check_client([pixel_steps(ordinary)] * 3, pixel_steps(ordinary), defaults)  # a client may have 4 of them
    with pytest.raises(LimitError, match="at most 4 at once"):
        check_client([pixel_steps(ordinary)] * 4, 1, defaults)
    with pytest.raises(LimitError, match=r"this request is 1,258,291,200 pixel-steps .* \(dwb app --max-pixel-steps\)"):
        validate(params(width=1024, height=1024, steps=150, batch_size=8), defaults)

    axes = tuple(parse_axis(name, kind, values, defaults) for name, kind, values in (("X", "seed", "1, 2"),
                                                                                    ("Y", "steps", "4, 6"), ("Z", "", "")))
    assert plan("a", "ema", params(steps=99), axes, defaults).pixel_steps() == 16 * 16 * (4 + 6) * 2  # summed cells
    with pytest.raises(LimitError, match="this request is 5,120 pixel-steps"):
        plan("a", "ema", params(), axes, Limits(max_pixel_steps=5119))
