"""The CLIP BPE tokenizer built from the shipped vocabulary file: OpenAI CLIP's ids, every byte encodable."""
from __future__ import annotations

from transformers import CLIPTokenizer

from models.checkpoints.clip_bpe import byte_symbols, clip_vocab, write_clip_tokenizer


def test_the_vocabulary_has_clip_ids():
    vocab = clip_vocab()
    assert len(vocab) == 49408 and len(set(byte_symbols())) == 256
    assert (vocab["!"], vocab["!</w>"], vocab["in"]) == (0, 256, 512)  # bytes, word-final bytes, first merge
    assert (vocab["<|startoftext|>"], vocab["<|endoftext|>"]) == (49406, 49407)


def test_the_tokenizer_encodes_as_clip_and_round_trips_any_text(tmp_path):
    tokenizer = CLIPTokenizer.from_pretrained(write_clip_tokenizer(tmp_path, pad_token="!"))
    assert tokenizer("A photo of a CAT.").input_ids == [49406, 320, 1125, 539, 320, 2368, 269, 49407]
    text = "naïve café, 東京 🙂 — tab\there"
    ids = tokenizer(text).input_ids
    assert tokenizer.unk_token_id not in ids[1:-1]  # byte-level: nothing is unknown
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert decoded.replace(" ", "") == text.lower().replace(" ", "").replace("\t", "")  # CLIP folds whitespace
