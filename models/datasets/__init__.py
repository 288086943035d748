"""Datasets on disk: the image-caption MDS format every training dataset is written in (``mds``: its columns, the
writer, opening and checking a dataset, counting its samples, one dataset of a mixture). Training reads it through
Streaming; evaluate reads reference sets from it; the shapes domain's scorer trains on it.
"""
from ..common import face

__getattr__, __all__ = face(__name__, {
    "mds": "ASPECT_COLUMNS BUCKET_FOLDER DREAMBOOTH_COLUMNS StreamConfig UNSAFE_ENCODINGS bucket_dirs bucket_folders buckets_of_index "
           "by_aspect check_safe_columns checked_index count_samples image_columns open_local open_streaming "
           "open_writer",
})
