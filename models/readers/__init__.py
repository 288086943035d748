"""Readers of files from elsewhere, bounded before they read: zip heads and their inflated sizes, DCP's sharded
checkpoint index and values, the plain types a weights-only load accepts, and the tokenizer files a
checkpoint carries. They build data and nothing else; the checkpoint door stands on them."""
from ..common import face

__getattr__, __all__ = face(__name__, {
    "plain": "SAFE_TYPES",
    "sharded": "is_sharded_folder load_sharded_state METADATA sharded_problem",
    "tokenizer_files": "check_pipeline_folder TOKENIZER_FILES tokenizer_from_files",
    "ziphead": "check_inflation zip_head",
})
