"""AUTOMATIC1111's ``<lora:NAME:STRENGTH>`` prompt syntax: the tags read out of a prompt, and a tag's strength or name
changed in it (an X/Y/Z axis).

As AUTOMATIC1111 reads them: a tag is ``<lora:...>`` (or ``<lyco:...>``, its older alias), its text split on ``:``;
the first item is the LoRA's name, the second its strength (1 where none is given; ``te=`` names it too), a third a
separate strength for the denoiser (``unet=``), the text encoders' where none is given. The tags are taken out of the
text the model reads and kept in the prompt the image's parameters record. Which file a name means is the caller's
(the app resolves it among the files under its folders): no name here is ever a path.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import WorkbenchError

MAX_STRENGTH = 10.0  # AUTOMATIC1111's slider spans -2 to 2; a strength past 10 is a typing slip (every command's bound)
# A1111 matches ``<(\w+):([^>]+)>``; only its LoRA networks are read here: other tags stay in the text
LORA_TAG = re.compile(r"<(?:lora|lyco):([^<>]*)>")


@dataclass(frozen=True)
class LoraTag:
    name: str  # as written (A1111's "mentioned name")
    strength: float
    span: tuple[int, int]  # where the tag is in the prompt


def _number(text: str, tag: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise WorkbenchError(f"{tag}: the strength {text.strip()[:20]!r} is not a number") from None
    if not math.isfinite(value):
        raise WorkbenchError(f"{tag}: the strength {text.strip()[:20]!r} is not a finite number")
    return value


def _tag(match: re.Match) -> LoraTag:
    """One tag read as A1111 reads it; a one-line WorkbenchError where it asks what one strength per file cannot
    give (different text-encoder and denoiser strengths, a dynamic dimension)."""
    shown = match.group(0)[:80]
    items = match.group(1).split(":")
    positional = [i for i in items if "=" not in i]
    named = dict(i.split("=", 1) for i in items if "=" in i)
    name = positional[0].strip() if positional else ""
    if not name:
        raise WorkbenchError(f"{shown}: a LoRA tag names its file: <lora:NAME:STRENGTH>")
    unknown = set(named) - {"te", "unet"}
    if unknown or len(positional) > 3:
        raise WorkbenchError(f"{shown}: only <lora:NAME:STRENGTH> (and te=, unet=) is read here")
    te = _number(named.get("te", positional[1] if len(positional) > 1 else "1"), shown)
    unet = _number(named["unet"], shown) if "unet" in named else \
        _number(positional[2], shown) if len(positional) > 2 else te
    if te != unet:
        raise WorkbenchError(f"{shown}: one strength applies to the whole LoRA here, not {te:g} to the text "
                             f"encoders and {unet:g} to the denoiser")
    return LoraTag(name, te, match.span())


def lora_tags(prompt: str) -> tuple[str, list[LoraTag]]:
    """(the prompt without its LoRA tags, as the model reads it, each tag replaced by nothing as A1111 does; the
    tags in order); a one-line WorkbenchError for a tag that does not read, or a name given twice."""
    tags = [_tag(m) for m in LORA_TAG.finditer(prompt)]
    seen = set()
    for tag in tags:
        if tag.name in seen:
            raise WorkbenchError(f"the prompt names the LoRA {tag.name[:80]!r} twice: give it once, with one strength")
        seen.add(tag.name)
    return LORA_TAG.sub("", prompt), tags


def lora_tag(name: str, strength: float) -> str:
    """``<lora:NAME:STRENGTH>``."""
    return f"<lora:{name}:{strength:g}>"


def with_lora(prompt: str, name: str | None, strength: float | None) -> str:
    """The prompt with one LoRA tag changed: the tag named ``name`` set to ``strength``; else the prompt's one tag
    made ``name`` (where given) at ``strength`` (where given); else, in a prompt without tags, ``name``'s tag added
    (at 1 where no strength is given). A one-line WorkbenchError where the prompt's tags leave it open which to
    change."""
    _, tags = lora_tags(prompt)
    named = [t for t in tags if name is not None and t.name == name]
    if named or len(tags) == 1:
        tag = (named or tags)[0]
        new = lora_tag(name or tag.name, tag.strength if strength is None else strength)
        return prompt[:tag.span[0]] + new + prompt[tag.span[1]:]
    if not tags and name is not None:
        return f"{prompt} {lora_tag(name, 1.0 if strength is None else strength)}"
    held = f"holds {len(tags)} LoRA tags" if tags else "holds no LoRA tag"
    raise WorkbenchError(f"the prompt {held}: name the LoRA to vary (NAME or NAME:STRENGTH)")
