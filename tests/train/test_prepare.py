import json
import subprocess
import sys

from ..conftest import REPO

FIT = """
import json, sys
from train.shapes.prepare import fit_tokenizer
from models.shapes import make_sample
captions = [make_sample(0, "train", i, (16,))["caption"] for i in range(1500)]
tok = fit_tokenizer(captions, max_length=20)
print(json.dumps({"vocab": tok.get_vocab(), "ids": tok("a red circle above two small blue squares").input_ids,
                  "words": {w: tok.tokenize(w) for w in ("circle", "squares", "above", "purple")}}))
"""


def test_the_fitted_tokenizer_is_the_same_in_every_process():
    """The BPE trainer numbers its tokens in an order that changes between processes; the ids pick the
    text encoder's embedding rows, so `dwb prepare` renumbers them and the same data gives the same model."""
    runs = [json.loads(subprocess.run([sys.executable, "-c", FIT], cwd=REPO, capture_output=True, text=True,
                                      check=True).stdout) for _ in range(3)]
    assert runs[0]["vocab"] == runs[1]["vocab"] == runs[2]["vocab"]
    assert runs[0]["ids"] == runs[1]["ids"] == runs[2]["ids"]
    vocab = runs[0]["vocab"]
    assert vocab["<|startoftext|>"] == 0 and vocab["<|endoftext|>"] == 1 and sorted(vocab.values()) == list(range(len(vocab)))
    assert all(len(pieces) == 1 for pieces in runs[0]["words"].values())  # whole words are single tokens
