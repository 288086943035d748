"""train: Composer training on MosaicML Streaming data: the trainer, its Composer models, the data it reads,
its callbacks and the offline shapes domain. It stands on ``models`` (families, checkpoints, generation)."""
