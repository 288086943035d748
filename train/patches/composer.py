"""Composer's internals that training corrects, written against Composer 0.32.1 (and Streaming 0.13.0, whose
resume state ``align_dataset_epoch`` reads). `tests/train/test_compat.py` fingerprints each upstream function
named below and fails, naming the patch, when one changes.

**The RNG state on resumption** (``RestoreRNG``). Composer's ``Trainer._train_loop``
(``composer/trainer/trainer.py``) applies a checkpoint's RNG state (``Trainer._rng_state``, set by
``Trainer.__init__`` from ``checkpoint.load_checkpoint``) at the start of ``fit`` only when the checkpoint was
taken at an epoch boundary (``batch_in_epoch`` 0), or while it spins a dataloader forward to the resumed batch,
which it skips when the dataset resumes by itself (``'train' in state.dataset_resumption``). A Streaming dataset
resumes inside an epoch by itself, and then Composer never applies the saved state: the resumed run would draw
other noise, timesteps and caption dropouts. No upstream issue found. Two cases, told apart by where the
checkpoint was taken:

- *inside an epoch*: the uninterrupted run goes on with the iterator it already has; the resumed run
  first creates one, and creating a ``DataLoader`` iterator draws its base seed from torch's global RNG.
  The state is applied after the first batch is fetched (``AFTER_DATALOADER``), past that draw.
- *at an epoch's last batch* (``batch_in_epoch`` equal to the epoch's length; Composer saves at
  ``BATCH_CHECKPOINT``, before the epoch rolls over): Streaming yields nothing for the rest of that
  epoch, and the uninterrupted run's next draw is the *next* epoch's iterator seed. Applying the state
  after the first batch would skip that draw (measured: 1,144 of 1,622 model, EMA and optimizer tensors
  differed 6 batches later); it is applied at ``EPOCH_START`` of the next epoch, before the iterator.
  Composer's warning that the (empty) rest of the epoch trained no batches is silenced for that run.

**Streaming's position at an epoch boundary** (``align_dataset_epoch``). A checkpoint taken when an epoch ends
(``save_interval`` in epochs: Composer saves at ``EPOCH_CHECKPOINT``, after the epoch rolled over) asks the
dataset for its state with 0 samples seen; Streaming 0.13.0's ``StreamingDataset.state_dict``
(``streaming/base/dataset.py``) still counts the epoch it just finished as its current one
(``epoch = self.next_epoch - 1``) and records (that epoch, sample 0), so a resumed run replayed the finished
epoch's sample order instead of starting the next one (1,144 of 1,622 tensors differed). After loading such a
checkpoint, the dataset's resume state is moved to Composer's epoch, sample 0 (``StreamingDataset.load_state_dict``).
No upstream issue found.

**The "latest" pointer to a remote checkpoint** (``prompt_remote_latest``). Since mosaicml/composer#3376 (the
symlink uploaded only after the checkpoint's files), ``CheckpointSaver._save_checkpoint``
(``composer/callbacks/checkpoint_saver.py``) uploads the ``latest`` symlink once the checkpoint's files are found
in the object store, looking every ``_symlink_upload_wait_before_next_try_in_seconds`` (30 s, set in
``CheckpointSaver.__init__``; a private attribute Composer's own tests shorten); the upload itself runs in a
freshly spawned process that first imports Composer. So nearly every remote save's pointer waited a full 30 s,
and a run's end waited for it: two 2-batch runs saving to a local S3 server and resuming from it took 92 s, and
27 s looking every 2 s, as the workbench does (a HEAD request each, against an upload of minutes at full size).

**The file by which a node's processes wait for its first one** (``signal_files_per_node``). Since
mosaicml/composer#3485 (a signal file name safe on shared file systems), ``composer.utils.dist
.get_node_signal_file_name`` draws a random name on global rank 0 and broadcasts it, node rank included
(``._signal_file_node0_<random>``), to every node; its callers (``busy_wait_for_local_rank_zero`` in the same
module, ``Trainer._get_autoresume_checkpoint``, ``composer.utils.checkpoint.download_checkpoint``) look it up
there at call time.
Nodes sharing a save folder, as on a shared file system, wrote and deleted one file: node 0's first process
found it gone (FileNotFoundError) when 2 nodes x 2 processes resumed, as reported upstream in
mosaicml/llm-foundry#1736. The random part still comes from rank 0; the node part is each node's own.
"""
from __future__ import annotations

import functools
import warnings

from composer.core import Callback, Event, State
from composer.loggers import Logger
from composer.utils import reproducibility

# The versions this module was written and tested against (`tests/train/test_compat.py` compares them).
WRITTEN_FOR = {"mosaicml": "0.32.1", "mosaicml-streaming": "0.13.0"}
REMOTE_LATEST_CHECK_S = 2.0


class RestoreRNG(Callback):
    """Apply a checkpoint's RNG state at the point Composer would skip it (see the module docstring)."""

    def __init__(self):
        self.pending = None
        self.at = Event.AFTER_DATALOADER

    def take_over(self, trainer) -> None:
        """Call after the Trainer is built: claim the RNG state Composer would drop (reads ``trainer._rng_state``)."""
        rng, state = getattr(trainer, "_rng_state", None), trainer.state
        batch_in_epoch = int(state.timestamp.batch_in_epoch)
        if rng is None or batch_in_epoch == 0 or "train" not in state.dataset_resumption:
            return  # nothing to restore, or Composer restores it itself at the start of fit
        self.pending = rng
        trainer._rng_state = None
        epoch_length = state.dataloader_len
        if epoch_length is not None and batch_in_epoch >= int(epoch_length):
            self.at = Event.EPOCH_START
            warnings.filterwarnings("ignore", message="No batches were trained for global rank")

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        if event == self.at and self.pending is not None:
            reproducibility.load_rng_state(self.pending)
            self.pending = None


def align_dataset_epoch(trainer) -> None:
    """After a checkpoint taken at an epoch boundary, start the dataset at Composer's epoch (see above)."""
    state = trainer.state
    epoch = int(state.timestamp.epoch)
    if int(state.timestamp.batch_in_epoch) != 0 or epoch == 0 or "train" not in state.dataset_resumption:
        return
    dataset = getattr(state.train_dataloader, "dataset", None)
    if not hasattr(dataset, "state_dict"):
        return
    saved = dataset.state_dict(0, True)  # the resume state loaded from the checkpoint, as Streaming reads it
    if saved["epoch"] < epoch:
        dataset.load_state_dict({**saved, "epoch": epoch, "sample_in_epoch": 0})


def prompt_remote_latest(trainer) -> None:
    """Composer's checkpoint savers look for a remote checkpoint's files every 2 s, not 30 (see above)."""
    from composer.callbacks import CheckpointSaver

    for callback in trainer.state.callbacks:
        if isinstance(callback, CheckpointSaver) and callback.remote_uploader is not None:
            callback._symlink_upload_wait_before_next_try_in_seconds = REMOTE_LATEST_CHECK_S


def signal_files_per_node() -> None:
    """Each node names its own signal file, the random part still shared from rank 0 (see above; idempotent)."""
    from composer.utils import dist as composer_dist

    original = composer_dist.get_node_signal_file_name
    if getattr(original, "per_node", False):
        return

    @functools.wraps(original)
    def name(rng=None) -> str:
        shared = original(rng)
        return f"._signal_file_node{composer_dist.get_node_rank()}_{shared.rsplit('_', 1)[1]}"

    name.per_node = True
    composer_dist.get_node_signal_file_name = name
