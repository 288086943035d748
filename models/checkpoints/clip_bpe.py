"""OpenAI CLIP's BPE tokenizer, written from the vocabulary file shipped in the package (nothing downloaded).

SD 1.x (OpenAI CLIP ViT-L/14) and SD 2.x (OpenCLIP ViT-H/14) tokenize with the same vocabulary of
49,408 ids: the 256 byte symbols, the same 256 ending a word (``</w>``), one token per merge of the
first 48,894 merges in ``bpe_simple_vocab_16e6.txt.gz``, then ``<|startoftext|>`` and
``<|endoftext|>``. SD 1.x pads with the end token, SD 2.x with "!" (id 0).
"""
from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

BPE_FILE = Path(__file__).parent / "configs" / "clip" / "bpe_simple_vocab_16e6.txt.gz"
START, END = "<|startoftext|>", "<|endoftext|>"
VOCAB_SIZE = 49408
N_MERGES = VOCAB_SIZE - 2 * 256 - 2  # 48,894
MAX_LENGTH = 77  # the text towers' context length


def byte_symbols() -> list[str]:
    """The 256 characters that stand for the bytes, in vocabulary order (GPT-2's byte-level alphabet).

    Printable Latin-1 bytes stand for themselves and come first; the other 68 bytes (controls, space,
    DEL, NBSP, soft hyphen) become the characters from U+0100 on, in byte order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    n_others = 256 - len(printable)
    return [chr(b) for b in printable] + [chr(256 + n) for n in range(n_others)]


@functools.lru_cache(maxsize=1)
def clip_merges() -> tuple[tuple[str, str], ...]:
    """The first 48,894 merges of the vocabulary file (its first line is a header)."""
    lines = gzip.decompress(BPE_FILE.read_bytes()).decode("utf-8").split("\n")[1:N_MERGES + 1]
    merges = tuple(tuple(line.split()) for line in lines)
    if len(merges) != N_MERGES or any(len(m) != 2 for m in merges):
        raise RuntimeError(f"{BPE_FILE} is not the CLIP BPE vocabulary (expected {N_MERGES} merges)")
    return merges


@functools.lru_cache(maxsize=1)
def clip_vocab() -> dict[str, int]:
    """Token -> id, 49,408 entries, in the order the CLIP text towers' embedding tables use."""
    symbols = byte_symbols()
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in clip_merges()] + [START, END]
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != VOCAB_SIZE:
        raise RuntimeError(f"the CLIP vocabulary built from {BPE_FILE} has {len(vocab)} entries, not {VOCAB_SIZE}")
    return vocab


def write_clip_tokenizer(folder: str | Path, *, pad_token: str, max_length: int = MAX_LENGTH) -> Path:
    """A ``CLIPTokenizer`` folder (vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json).

    ``pad_token``: ``"<|endoftext|>"`` for SD 1.x, ``"!"`` for SD 2.x.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(clip_vocab(), ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in clip_merges()) + "\n",
                                       encoding="utf-8")
    special = {"bos_token": START, "eos_token": END, "unk_token": END, "pad_token": pad_token}
    config = {**special, "tokenizer_class": "CLIPTokenizer", "model_max_length": max_length, "do_lower_case": True,
              "errors": "replace", "add_prefix_space": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2), encoding="utf-8")
    return folder
