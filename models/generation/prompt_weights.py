"""AUTOMATIC1111's prompt weighting, read within bounds and drawn through compel's embeddings.

A1111's syntax: ``(word)`` multiplies a word's attention by 1.1, ``[word]`` divides it by 1.1, ``(word:1.5)`` sets
the factor, brackets nest (their factors multiply; one left open runs to the end of the prompt), ``\\(`` ``\\)``
``\\[`` ``\\]`` are the characters themselves, and ``BREAK`` ends the current 75-token chunk. We read it into
(text, weight) pieces (``weighted_parts``) and write those in compel's syntax (``to_compel``: ``(word)1.5``, chunks as
``("...", "...").and()``); compel builds the embeddings the pipeline is called with (``prompt_conditioning``).

A prompt whose pieces all weigh 1 and hold no BREAK is unweighted and goes to the pipeline as typed, so it draws
what it drew before. A family that compel cannot condition (its entry's ``prompt_weights`` are empty: SD3's T5,
Flux.1's) refuses a weighted prompt in one line.

Bounds (each refused in one line): a weight is a finite number from 0 to ``MAX_PROMPT_WEIGHT`` (100, twenty times
A1111's slider's end of 2 and well past where images stop changing meaningfully; compel's syntax has no negative
weight), brackets nest at most ``MAX_PROMPT_NESTING`` deep (16: 1.1^16 is 4.6), a weighted prompt is at most
``MAX_WEIGHTED_CHARS`` characters and ``MAX_PROMPT_CHUNKS`` chunks of 75 tokens (8: 600 tokens, cross-attention's
keys eight times SD's usual 77).

Light to import (no torch, no compel): the parsing and checks run before a checkpoint is opened.
"""
from __future__ import annotations

import math
import re

from ..errors import WorkbenchError

MAX_PROMPT_WEIGHT = 100.0
MAX_PROMPT_NESTING = 16
MAX_PROMPT_CHUNKS = 8
MAX_WEIGHTED_CHARS = 20_000
CHUNK_TOKENS = 75  # a CLIP window of 77 less its start and end tokens: what BREAK pads to
ROUND, SQUARE = 1.1, 1 / 1.1  # A1111's factors of ( ) and [ ]

# one token of A1111's syntax: an escaped bracket or backslash, an opening bracket, ":NUMBER)" (an explicit weight),
# a closing bracket, a run of plain text, or a lone ":" or "\\"
_NUMBER = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
_TOKEN = re.compile(rf"\\[\\()\[\]]|[(\[]|:\s*({_NUMBER})\s*\)|[)\]]|[^\\()\[\]:]+|[:\\]")
_BREAK = re.compile(r"\s*\bBREAK\b\s*")
_MARKS = re.compile(r"[()\[\]\\]|\bBREAK\b")  # a prompt without these has no weighting syntax at all


def _refuse(prompt: str, why: str) -> WorkbenchError:
    return WorkbenchError(f"the weighted prompt {prompt[:40]!r}{'...' if len(prompt) > 40 else ''}: {why}")


def _closed(pieces: list, start: int, factor: float) -> None:
    for piece in pieces[start:]:
        if piece is not None:
            piece[1] *= factor


def _read_pieces(prompt: str) -> list:
    """[text, weight] pieces in order, None where a BREAK stands (A1111's reading of brackets and escapes)."""
    pieces, rounds, squares = [], [], []
    for match in _TOKEN.finditer(prompt):
        token, weight = match.group(0), match.group(1)
        if token[0] == "\\":  # an escaped character is itself; a lone backslash is nothing (as in A1111)
            pieces.append([token[1:], 1.0])
        elif token in "([":
            (rounds if token == "(" else squares).append(len(pieces))
            if len(rounds) + len(squares) > MAX_PROMPT_NESTING:
                raise _refuse(prompt, f"brackets nest more than {MAX_PROMPT_NESTING} deep")
        elif weight is not None and rounds:
            value = float(weight)
            if not 0 <= value <= MAX_PROMPT_WEIGHT:  # inf too
                raise _refuse(prompt, f"the weight {weight.strip()} is outside 0 to {MAX_PROMPT_WEIGHT:g}")
            _closed(pieces, rounds.pop(), value)
        elif token == ")" and rounds:
            _closed(pieces, rounds.pop(), ROUND)
        elif token == "]" and squares:
            _closed(pieces, squares.pop(), SQUARE)
        else:
            for i, text in enumerate(_BREAK.split(token)):
                pieces.extend(([None] if i else []) + [[text, 1.0]])
    for start in rounds:  # left open: to the end of the prompt
        _closed(pieces, start, ROUND)
    for start in squares:
        _closed(pieces, start, SQUARE)
    return pieces


def weighted_parts(prompt: str) -> list[list[tuple[str, float]]]:
    """A1111's reading of ``prompt``: its chunks (BREAK between them), each a list of (text, weight) with neighbours
    of one weight joined and empty text left out; a one-line WorkbenchError for a weighting past the bounds."""
    if len(prompt) > MAX_WEIGHTED_CHARS:
        raise _refuse(prompt, f"{len(prompt):,} characters; a weighted prompt holds at most {MAX_WEIGHTED_CHARS:,}")
    chunks = [[]]
    for piece in _read_pieces(prompt):
        if piece is None:
            chunks.append([])
            continue
        text, weight = piece
        if not math.isfinite(weight) or not 0 <= weight <= MAX_PROMPT_WEIGHT:
            raise _refuse(prompt, f"a weight multiplies to {weight:g}, outside 0 to {MAX_PROMPT_WEIGHT:g}")
        if chunks[-1] and chunks[-1][-1][1] == weight:
            chunks[-1][-1] = (chunks[-1][-1][0] + text, weight)
        elif text:
            chunks[-1].append((text, weight))
    kept = [chunk for chunk in chunks if any(text.strip() for text, _ in chunk)]
    return kept or [[]]


def is_weighted(prompt: str) -> bool:
    """Whether ``prompt`` weighs anything: a piece whose weight is not 1, or a BREAK."""
    if not _MARKS.search(prompt):
        return False
    parts = weighted_parts(prompt)
    return len(parts) > 1 or any(weight != 1 for _, weight in parts[0])


def _weight_text(weight: float) -> str:
    """``weight`` as compel's number reads it: plain decimals (compel reads no exponent), the shortest that is exact."""
    text = repr(float(weight))
    return text if "e" not in text else f"{weight:.24f}".rstrip("0")


def _escaped(text: str) -> str:
    return text.replace("(", "\\(").replace(")", "\\)").replace('"', '\\"')


def _compel_chunk(chunk: list[tuple[str, float]]) -> str:
    return " ".join(_escaped(text).strip() if weight == 1 else f"({_escaped(text).strip()}){_weight_text(weight)}"
                    for text, weight in chunk if text.strip())


def to_compel(prompt: str) -> str:
    """``prompt`` in compel's syntax: each weighted piece as ``(text)WEIGHT``, text escaped, and chunks (BREAK) as
    ``("chunk", "chunk").and()``, which compel encodes each in its own 75-token window and joins; a one-line
    WorkbenchError where compel would read it otherwise than A1111 does (text that is compel's own syntax: a word
    ending in + or -, .and(), .swap(), .blend())."""
    chunks = weighted_parts(prompt)
    texts = [_compel_chunk(chunk) for chunk in chunks]
    translated = texts[0] if len(texts) == 1 else \
        "(" + ", ".join('"' + text.replace('"', '\\"') + '"' for text in texts) + ").and()"
    if _compel_reading(translated) != [_squeezed(chunk) for chunk in chunks]:
        raise _refuse(prompt, "its text holds compel's own syntax (a word ending in + or -, .and(), .swap(), "
                              ".blend(), quotes), which compel would weigh otherwise than AUTOMATIC1111: rephrase it")
    return translated


def _squeezed(chunk) -> list[tuple[str, float]]:
    """(text without whitespace, weight) runs of one weight, to compare two readings of a chunk."""
    runs = []
    for text, weight in chunk:
        text = "".join(text.split())
        if not text:
            continue
        if runs and math.isclose(runs[-1][1], weight, rel_tol=1e-12):
            runs[-1] = (runs[-1][0] + text, runs[-1][1])
        else:
            runs.append((text, weight))
    return runs


def _compel_reading(text: str) -> list:
    """compel's own reading of ``text``: its prompts' (text, weight) runs; None where it is not plain weighting."""
    from compel import Compel
    from compel.prompt_parser import FlattenedPrompt

    try:
        conjunction = Compel.parse_prompt_string(text)
    except Exception:  # noqa: BLE001 - compel's parser raises what pyparsing and its own objects raise
        return None
    if any(type(p) is not FlattenedPrompt or p.wants_cross_attention_control for p in conjunction.prompts) \
            or any(w != 1 for w in conjunction.weights):
        return None
    return [_squeezed([(f.text, f.weight) for f in p.children]) for p in conjunction.prompts] or [[]]


def plain_prompt(prompt: str) -> str:
    """An unweighted prompt's text as A1111 reads it: as typed where it holds no brackets, escapes or BREAK (so it
    draws what it drew before), its pieces' text otherwise (``a [(cat)] b``: ``a cat b``; ``\\(x\\)``: ``(x)``)."""
    if not _MARKS.search(prompt):
        return prompt
    return "".join(text for chunk in weighted_parts(prompt) for text, _ in chunk)


def check_prompt_weights(family, prompts, clip_skip: int = 1) -> None:
    """A one-line WorkbenchError where a prompt of ``prompts`` is weighted and ``family`` takes no weights (or not at
    this Clip skip), or one past the bounds; nothing for unweighted prompts."""
    for prompt in prompts:
        if prompt and is_weighted(prompt):
            if not family.takes_prompt_weights:
                raise WorkbenchError(f"{family.label} takes no prompt weighting ((word:1.2), [word], BREAK): compel "
                                     f"builds none of its text conditioning; give the prompt without it")
            if clip_skip > len(family.prompt_weights):
                raise WorkbenchError(f"{family.label} draws a weighted prompt at Clip skip 1"
                                     f"{' or 2' if len(family.prompt_weights) > 1 else ''} alone (the layers compel "
                                     f"takes), got {clip_skip}")
            to_compel(prompt)


def _compel_of(pipe, run, family, clip_skip: int):
    """compel over ``pipe``'s CLIP towers present (SDXL's refiner: its second alone), pooled from the last where the
    pipeline ``run`` takes pooled embeddings, chunks of 75 tokens kept whole (no truncation, as A1111)."""
    import inspect

    from compel import Compel, ReturnedEmbeddingsType

    names = [name for name in family.text_encoders if getattr(pipe, name, None) is not None]
    encoders = [getattr(pipe, name) for name in names]
    tokenizers = [getattr(pipe, name.replace("text_encoder", "tokenizer")) for name in names]
    pooled = "pooled_prompt_embeds" in inspect.signature(run.__call__).parameters
    one = len(encoders) == 1
    return Compel(tokenizer=tokenizers[0] if one else tokenizers, text_encoder=encoders[0] if one else encoders,
                  truncate_long_prompts=False,
                  returned_embeddings_type=ReturnedEmbeddingsType[family.prompt_weights[clip_skip - 1]],
                  requires_pooled=pooled if one else [False] * (len(encoders) - 1) + [pooled],
                  dtype_for_device_getter=lambda device: encoders[0].dtype), pooled, tokenizers[0]


def _check_chunks(tokenizer, prompt: str) -> None:
    chunks = sum(max(1, math.ceil(sum(len(tokenizer(text, add_special_tokens=False).input_ids) for text, _ in chunk)
                                  / CHUNK_TOKENS)) for chunk in weighted_parts(prompt))
    if chunks > MAX_PROMPT_CHUNKS:
        raise _refuse(prompt, f"{chunks} chunks of {CHUNK_TOKENS} tokens; a weighted prompt takes at most "
                              f"{MAX_PROMPT_CHUNKS}")


def prompt_conditioning(pipe, run, family, prompts: list[str], negative_prompt: str, clip_skip: int) -> dict | None:
    """The text arguments of a call of ``run`` (a pipeline sharing ``pipe``'s towers) where a prompt of ``prompts``
    or ``negative_prompt`` is weighted: compel's ``prompt_embeds`` and ``negative_prompt_embeds`` (with SDXL's
    pooled ones), padded to one length; None where none is weighted (the pipeline encodes the text as ever). An
    empty negative prompt is left to a pipeline that zeroes it (SDXL's ``force_zeros_for_empty_prompt``)."""
    if not any(p and is_weighted(p) for p in [*prompts, negative_prompt]):
        return None
    check_prompt_weights(family, [*prompts, negative_prompt], clip_skip)
    compel, pooled, tokenizer = _compel_of(pipe, run, family, clip_skip)
    for prompt in {*prompts, negative_prompt}:
        _check_chunks(tokenizer, prompt)
    positive = compel([to_compel(p) for p in prompts])
    args = dict(zip(("prompt_embeds", "pooled_prompt_embeds"), positive)) if pooled else {"prompt_embeds": positive}
    if negative_prompt or not getattr(run, "config", {}).get("force_zeros_for_empty_prompt", False):
        negative = compel([to_compel(negative_prompt)] * len(prompts))
        if pooled:
            args["negative_pooled_prompt_embeds"] = negative[1]
            negative = negative[0]
        args["prompt_embeds"], args["negative_prompt_embeds"] = compel.pad_conditioning_tensors_to_same_length(
            [args["prompt_embeds"], negative])
    return args
