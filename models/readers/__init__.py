"""Readers of files from elsewhere, bounded before they read: zip heads and their inflated sizes, DCP's sharded
checkpoint index and values, the plain types a weights-only load accepts, and the tokenizer files a
checkpoint carries, a safetensors file's head; and the judge of a local path data from elsewhere leads to. They build data and nothing else; the checkpoint door stands on them."""
from ..common import face

__getattr__, __all__ = face(__name__, {
    "paths": "outside_root unsafe_name",
    "plain": "SAFE_TYPES",
    "safetensors_head": "DTYPE_BYTES MAX_HEADER read_safetensors_head SafetensorsHead TensorEntry",
    "sharded": "is_sharded_folder load_sharded_state METADATA sharded_problem",
    "tokenizer_files": "check_pipeline_folder TOKENIZER_FILES tokenizer_from_files",
    "ziphead": "check_inflation zip_head",
})
