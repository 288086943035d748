"""What a checkpoint may hold besides tensors and Python's own data when it is loaded with ``weights_only=True``:
the plain data types Composer's checkpoints hold (RNG states, timestamps, versions), full or sharded."""
from __future__ import annotations

import datetime

import numpy as np
import torch

SAFE_TYPES = [np.ndarray, np.dtype, np._core.multiarray._reconstruct, datetime.timedelta,
              torch.torch_version.TorchVersion,
              *(type(np.dtype(t)) for t in ("uint32", "int64", "float64", "float32", "bool"))]
