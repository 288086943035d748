"""A PNG's generation parameters as three independent readers of AUTOMATIC1111's text convention see them: the
app's PNG Info (from the ``parameters`` text alone, not our JSON record) and two readers from PyPI, sd-parsers
and sd-prompt-reader. Each gives the same fields, as strings, so a test compares them with one dict."""
from __future__ import annotations

from pathlib import Path

FIELDS = ("prompt", "negative_prompt", "steps", "sampler", "guidance", "seed", "size", "model", "model_hash")


def by_png_info(path: Path) -> dict[str, str]:
    from app.png_info import read_png_info
    from models.generation import parse_parameters

    text, _ = read_png_info(path)
    p = parse_parameters(text)
    return {"prompt": p["prompt"], "negative_prompt": p["negative_prompt"], "steps": p["Steps"],
            "sampler": p["Sampler"], "guidance": p["CFG scale"], "seed": p["Seed"], "size": p["Size"],
            "model": p["Model"], "model_hash": p["Model hash"]}


def by_sd_parsers(path: Path) -> dict[str, str]:
    from sd_parsers import ParserManager

    info = ParserManager().parse(path)
    [sampler] = info.samplers
    return {"prompt": ", ".join(p.value for p in sampler.prompts),
            "negative_prompt": ", ".join(p.value for p in sampler.negative_prompts), "steps": sampler.parameters["steps"],
            "sampler": sampler.name, "guidance": sampler.parameters["cfg_scale"], "seed": sampler.parameters["seed"],
            "size": info.metadata["Size"], "model": sampler.model.name, "model_hash": sampler.model.hash}


def by_sd_prompt_reader(path: Path) -> dict[str, str]:
    from sd_prompt_reader.image_data_reader import ImageDataReader

    reader = ImageDataReader(str(path))
    assert reader.tool == "A1111 webUI", reader.tool  # it recognised the format
    settings = reader.parameter
    hashes = dict(part.split(": ", 1) for part in reader.setting.split(", ") if part.startswith("Model hash: "))
    return {"prompt": reader.positive, "negative_prompt": reader.negative, "steps": settings["steps"],
            "sampler": settings["sampler"], "guidance": settings["cfg"], "seed": settings["seed"],
            "size": settings["size"], "model": settings["model"], "model_hash": hashes["Model hash"]}


READERS = {"png info": by_png_info, "sd-parsers": by_sd_parsers, "sd-prompt-reader": by_sd_prompt_reader}


def read_by_every_reader(path: Path) -> dict[str, dict[str, str]]:
    """Each reader's fields of ``path``, by reader."""
    return {name: read(Path(path)) for name, read in READERS.items()}


def expected_fields(record) -> dict[str, str]:
    """What every reader should read of an ImageRecord (its prompts on one line)."""
    from models.generation import as_one_line

    return {"prompt": as_one_line(record.prompt), "negative_prompt": as_one_line(record.negative_prompt),
            "steps": str(record.steps), "sampler": record.sampler, "guidance": f"{record.guidance:g}",
            "seed": str(record.seed), "size": f"{record.width}x{record.height}", "model": record.checkpoint,
            "model_hash": record.checkpoint_hash}
