"""evaluate: scores every checkpoint (FID, KID, CLIP score, guidance sweeps) and writes DrawBench/PartiPrompts sample sets."""
