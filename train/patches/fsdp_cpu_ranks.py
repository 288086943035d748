"""What FSDP needs on CPU ranks only (gloo, no accelerator: the multi-rank tests and `dwb train` with ``fsdp`` on a
CPU), written against Composer 0.32.1 and PyTorch 2.7.0. ``fsdp_on_cpu`` puts all three in place; the trainer
calls it only when FSDP runs on a CPU, and each is a pass-through on a GPU rank. All three come from one fact:
moving a tensor that is already on the CPU to the CPU (``.cpu()``, ``.to("cpu")``) returns the tensor itself, not
a copy, where code written for GPUs expects a copy.

**Composer's FSDP device** (``fsdp_on_cpu``). ``composer.distributed.prepare_fsdp_module``
(``composer/distributed/dist_strategy.py``) passes ``device_id=torch.cuda.current_device()`` to PyTorch's FSDP,
which fails without CUDA. While it runs, ``torch.cuda.current_device`` answers the CPU device, which FSDP takes
as its ``device_id``. Composer's ``State`` imports the function from ``composer.distributed`` at call time, and
``composer.checkpoint.load`` imported it by name at its top: both names are replaced. *Not needed on a GPU*: there
``torch.cuda.current_device`` is the rank's device, and the wrapper calls Composer's function as it is whenever
CUDA is available. No upstream issue found.

**The flat parameter offloaded to itself** (``_keep_cpu_weights_when_offloading``). PyTorch 2.7.0's
``FlatParamHandle.to_cpu`` (``torch/distributed/fsdp/_flat_param.py``) "offloads" a gathered flat parameter by
moving it to the CPU and freeing the unsharded original (``_free_unsharded_flat_param``); on a CPU rank the move
returns the original itself, so its storage was freed under the parameter's views and the first full state dict
(Composer asks for one, offloaded, at every checkpoint) segfaulted. A flat parameter already on the CPU is left
where it is. Reported upstream as pytorch/pytorch#188989, with a fix proposed in pytorch/pytorch#188990 that
returns early the same way (and by Lightning as Lightning-AI/pytorch-lightning#21804). *Not needed on a GPU*: the
move to the CPU is a real copy, and freeing the GPU storage leaves it intact.

**Gathered optimizer states copied** (``_copy_gathered_optimizer_states``). PyTorch 2.7.0's FSDP gathers each
optimizer state (``exp_avg``, then ``exp_avg_sq``) into one buffer and ``_unflatten_orig_param_states``
(``torch/distributed/fsdp/_optim_utils.py``) hands out views of it: it clones them only when not offloading
(``elif not cpu_offload``) and otherwise relies on ``value.cpu()`` to copy them before the next state overwrites
the buffer. On a CPU rank that call copies nothing: every saved ``exp_avg`` held the ``exp_avg_sq`` values, and a
run resumed from a FULL_SHARD checkpoint drifted (0.006 in the weights two batches later). The views are cloned
when the state's compute device is the CPU; the caller (``_optim_utils._allgather_orig_param_states``) looks
the function up in its module at call time. *Not needed on a GPU*: ``value.cpu()`` copies from the GPU's buffer
into new CPU memory. No upstream issue found.
"""
from __future__ import annotations

import contextlib
import functools

import torch

# The versions this module was written and tested against (`tests/train/test_compat.py` compares them).
WRITTEN_FOR = {"mosaicml": "0.32.1", "torch": "2.7.0"}


def fsdp_on_cpu() -> None:
    """Composer's FSDP preparation on CPU ranks, and PyTorch's offloads that copy nothing there (see above;
    idempotent). Within the preparation ``torch.cuda.current_device`` answers the CPU device, which PyTorch's FSDP
    takes as its ``device_id``."""
    import composer.checkpoint.load as composer_load
    import composer.distributed as composer_distributed

    original = composer_distributed.prepare_fsdp_module
    if getattr(original, "on_cpu", False):
        return

    @functools.wraps(original)
    def prepare(*args, **kwargs):
        if torch.cuda.is_available():
            return original(*args, **kwargs)
        asked = torch.cuda.current_device
        torch.cuda.current_device = lambda: torch.device("cpu")
        try:
            return original(*args, **kwargs)
        finally:
            torch.cuda.current_device = asked

    prepare.on_cpu = True
    composer_distributed.prepare_fsdp_module = prepare  # Composer's State imports it from here at call time
    composer_load.prepare_fsdp_module = prepare
    _keep_cpu_weights_when_offloading()
    _copy_gathered_optimizer_states()


def _copy_gathered_optimizer_states() -> None:
    """Clone the gathered optimizer states' views on a CPU rank, where the offload copies nothing (see above)."""
    from torch.distributed.fsdp import _optim_utils

    original = _optim_utils._unflatten_orig_param_states
    if getattr(original, "copies", False):
        return

    @functools.wraps(original)
    def unflatten(fsdp_param_info, output_states, state_name, shard_state, to_save, cpu_offload):
        original(fsdp_param_info, output_states, state_name, shard_state, to_save, cpu_offload)
        if to_save and cpu_offload and not shard_state and fsdp_param_info.state.compute_device.type == "cpu":
            for states in output_states.values():
                if isinstance(states.get(state_name), torch.Tensor):
                    states[state_name] = states[state_name].clone()

    unflatten.copies = True
    _optim_utils._unflatten_orig_param_states = unflatten


def _keep_cpu_weights_when_offloading() -> None:
    """A flat parameter already on the CPU stays where it is when FSDP offloads it (see above)."""
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    original = FlatParamHandle.to_cpu
    if getattr(original, "keeps_cpu_weights", False):
        return

    @contextlib.contextmanager
    def to_cpu(self):
        if self.flat_param.device.type == "cpu":
            yield
            return
        with original(self):
            yield

    to_cpu.keeps_cpu_weights = True
    FlatParamHandle.to_cpu = to_cpu
