"""Where training relies on a library's private internals: one module per upstream, each patch with the version
it was written against, the upstream behaviour it changes and why.

- ``composer``: Composer 0.32.1's resumption (the RNG state, Streaming's epoch at a boundary), its "latest"
  pointer to a remote checkpoint, its per-node signal files and its EMA under FSDP;
- ``fsdp``: PyTorch 2.7.0's FSDP as the trainer reads it on any device (full weights for EMA, each rank's share);
- ``fsdp_cpu_ranks``: what only CPU ranks need of Composer's and PyTorch's FSDP (each says why a GPU does not);
- ``streaming``: Streaming 0.13.0's shared memory, freed within one process (test sessions).

The app's Gradio patches are the app's own (``app.gradio_patches``); diffusers' Flux.1 converter, which the
checkpoint door uses, stays on the ground floor (``models.common.diffusers_patches``). `tests/train/test_compat.py`
fails, naming the patch to re-read, when an installed library differs from the one a patch was written against.

Nothing is imported here: the trainer imports each module by its name (``from .patches.composer import ...``),
so a command that needs one patch does not load another library.
"""
