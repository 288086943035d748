"""What goes in: image-caption data converted to Streaming's MDS format, read back for training, and
precomputed VAE latents and text hidden states.

- ``convert``: every source layout into MDS resolution buckets, on a pool of processes, resumable, in parts
  (`dwb data convert`, `dwb data join`); the layouts' readers: ``layouts`` (which layout, units of work),
  ``tar_shards`` (WebDataset, img2dataset's webdataset output), ``tables`` (Parquet, datasets),
  ``image_folders`` (image folders, img2dataset's files output), ``records``, ``storage`` (local, s3://);
- ``buckets``: the aspect-ratio bucket sets of a pixel budget, each image's bucket and its cover-and-crop
  (`dwb data convert --aspect-buckets`);
- ``mds``: the MDS columns, writing, opening and checking datasets, one dataset of a mixture (``StreamConfig``);
- ``loader``: the streaming datasets and dataloader of a training phase (crop, tokenize, caption dropout);
- ``latents``: the precomputed-latents format and its compatibility checks;
- ``precompute``: encoding a dataset once with the VAE and text encoder (`dwb data precompute`);
- ``dreambooth``: a small folder of images as DreamBooth trains on it (`dwb data dreambooth`): ``small_folders``
  (captions, trigger-word templates, masks; every file judged before it is read), ``class_images`` (prior
  preservation's class images, drawn by the base and cached).
"""
from models.common import face

__getattr__, __all__ = face(__name__, {
    "class_images": "ClassPrompt cached_class_images",
    "convert": "ConvertSummary convert_to_mds join_parts",
    "dreambooth": "DreamboothSummary write_dreambooth",
    "latents": "META check_compatible decode_array read_meta",
    "loader": "build_dataloader check_remote_access image_to_tensor latent_meta model_range token_ids",
    "precompute": "precompute_latents",
})
