"""The parts of a Flux.1-style model `dwb train` trains (its pipeline: ``components.assemble_pipeline``).

Flux.1 conditions on a T5 encoder's states (``text_encoder_2``, its tokenizer ``tokenizer_2``) and CLIP's pooled
output (``text_encoder``, ``tokenizer``). The tiny architecture's T5 is built here from its config with fixed random
weights (frozen, as the tiny CLIP tower is) and reads the tiny CLIP tokenizer's ids: the shapes captions' vocabulary
is the CLIP tokenizer's. FluxPipeline calls ``tokenizer_2`` with ``padding="max_length"`` and
``max_length=max_sequence_length``, which a CLIP tokenizer takes, so the same tokenizer saved in both slots loads in
plain ``FluxPipeline.from_pretrained``. The full-size architecture loads T5-XXL, CLIP-L and their tokenizers from
``model.pretrained`` (FLUX.1-schnell's layout), and the loader tokenizes each caption with both (T5's ids padded to
the run's ``model.text_tokens``, ``T5_TOKENS`` by default), as the pipeline does.
"""
from __future__ import annotations

import torch

from .architectures import ARCHITECTURES

# T5 tokens of every caption: FluxPipeline's default ``max_sequence_length``, so that a model trained here is drawn by
# a plain pipeline call with its defaults (its T5 reads the padding too: FluxPipeline passes T5 no attention mask)
T5_TOKENS = 512


def random_t5_encoder(architecture: str, vocab_size: int, pad_token_id: int, seed: int = 0):
    """The architecture's T5 encoder with fixed random weights (the same for the same seed)."""
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    config = T5Config(**ARCHITECTURES[architecture]["t5_encoder"], vocab_size=vocab_size, pad_token_id=pad_token_id)
    return T5EncoderModel(config).eval()


def load_t5_parts(pretrained: str, dtype: torch.dtype | None = None):
    """T5 encoder and its tokenizer from a FLUX.1 layout (``text_encoder_2/``, ``tokenizer_2/``); the encoder in
    ``dtype`` where given (its ``wo`` projections stay float32 under float16, as transformers keeps them)."""
    from transformers import T5EncoderModel, T5TokenizerFast

    from ..errors import WorkbenchError
    from .components import load_part, names_a_single_file
    from .frozen import load_options

    if names_a_single_file(pretrained):
        raise WorkbenchError(f"config key 'model.pretrained': T5's encoder and tokenizer load from a FLUX.1 diffusers "
                             f"folder or hub id (text_encoder_2/, tokenizer_2/), not a single file ({pretrained})")

    return (load_part(T5EncoderModel, pretrained, "text_encoder_2", "T5 text encoder",
                      **load_options(T5EncoderModel, dtype)),
            # FLUX.1's tokenizer config sets add_prefix_space, which makes transformers rebuild the tokenizer from its
            # SentencePiece model (and the sentencepiece package); its tokenizer.json holds that pre-tokenizer already,
            # and the spec keeps it without the key (``spec.tokenizer_files``), so training reads what a reopened
            # checkpoint reads
            load_part(T5TokenizerFast, pretrained, "tokenizer_2", "T5 tokenizer", add_prefix_space=None))
