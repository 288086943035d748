"""models: what every command stands on, from the trainer to the app.

- ``families``: one entry per model family (SD 1/2, SDXL, SD3, Flux.1): its parts, detection, conditioning,
  noise, samplers and sizes;
- ``checkpoints``: the one door into checkpoints: find, name, hash, describe and open every kind a user holds;
- ``readers``: files from elsewhere read within bounds (zip heads, DCP indexes, tokenizer files);
- ``export``: checkpoints out to other tools (diffusers folders' model cards, the published single-file layouts);
- ``generation``: checkpoint -> images: the one generation path, samplers, seeds, grids, PNG parameters;
- ``common``: the ground floor (files written whole, typed configs, bounded JSON, the servers' limits);
- ``errors``: ``WorkbenchError``, the one-line error every room raises.

Nothing here imports Composer: opening, exporting and drawing from a checkpoint need no training framework.
"""
