"""The models that score images: Inception and DINOv2 features (``features``, ``dinov2``), the CLIP score
(``clip``), and the learned human-preference scorers (``preference`` and one module per scorer: PickScore,
HPSv2.1, ImageReward, the LAION aesthetic predictor). Each takes images as its authors' code does; none knows
of rows, runs or checkpoints."""
