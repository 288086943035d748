"""EMA of the trainable weights, as Composer's EMA algorithm, with the per-batch update fused, and under FSDP
sharded where the weights are.

Composer's ``compute_ema`` issues four small ops per tensor; on a CPU each costs 10-100 us, which
made EMA a visible share of a tiny model's step. Here the update is one ``_foreach_lerp_`` over all
tensors. Only floating-point tensors are averaged (integer buffers such as position ids stay as
they are). Without FSDP, state, checkpoints and the swap of EMA weights in for eval and saving are Composer's.

Under FSDP each rank averages its own shard (``ShardedEMA``): per FSDP unit, one tensor of the size of the unit's
flat parameter on this rank (``train.patches.fsdp.fsdp_flat_params``), updated from it in place and swapped with it
where the EMA weights are measured, drawn or saved, with no gather. Composer's EMA copied every weight inside
``summon_full_params`` and the update gathered them all again at every step: on 2 gloo ranks each rank held 538,786
of the tiny UNet's 1,077,572 weights and an EMA copy of all 1,077,572 (SDXL's UNet: 10 GB of EMA and a 10 GB gather
per GPU per step). A checkpoint alone gathers, on rank 0: its EMA state is Composer's, the full tensors under the
names of the FSDP-wrapped model's parameters (``unet._fsdp_wrapped_module.*``), which rank 0 writes into a full
checkpoint's file and into a sharded checkpoint's folder (DCP stores the algorithms' state as one value, written by
the lowest rank). A run that resumes reads it whole and writes it into its ranks' shards when it starts
(``Event.FIT_START``).
"""
from __future__ import annotations

import torch
from composer.algorithms import EMA
from composer.algorithms.ema.ema import EMAParameters
from composer.core import Algorithm, Event

from .patches.fsdp import fsdp_drop_gathered, fsdp_flat_params, fsdp_full_params


@torch.no_grad()
def fused_ema_update(model: torch.nn.Module, ema_model, smoothing: float) -> None:
    """ema <- smoothing * ema + (1 - smoothing) * current, for every tracked floating tensor."""
    params, buffers = ema_model.named_parameters_dict, ema_model.named_buffers_dict
    pairs = [(params[n], p) for n, p in model.named_parameters() if n in params]
    pairs += [(buffers[n], b) for n, b in model.named_buffers() if n in buffers and b.is_floating_point()]
    if pairs:
        torch._foreach_lerp_([e for e, _ in pairs], [c.detach() for _, c in pairs], 1.0 - smoothing)


def plain_trained(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The trained parameters of ``model`` that no FSDP unit holds (whole on every rank)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    held = {id(p) for unit in FullyShardedDataParallel.fsdp_modules(model) for p in unit.parameters()}
    return {name: p for name, p in model.named_parameters() if p.requires_grad and id(p) not in held}


class ShardedEMA:
    """The EMA of a model whose trained weights FSDP shards, kept where the weights are (see above): ``shards``, one
    per trained flat parameter, this rank's part of it; ``plain``, trained weights outside FSDP units, whole; and
    ``named_buffers_dict``, every buffer whole, as Composer's copy holds them. ``loaded``: the EMA state of a
    checkpoint, whole, until the run starts and shards it."""

    def __init__(self, model: torch.nn.Module | None = None):
        self.model = model
        self.shards: list[torch.Tensor] = []
        self.plain: dict[str, torch.Tensor] = {}
        self.named_buffers_dict: dict[str, torch.Tensor] = {}
        self.loaded: dict[str, torch.Tensor] = {}
        if model is not None:
            self.take(model)
            self.named_buffers_dict = {name: b.detach().clone() for name, b in model.named_buffers()}

    @torch.no_grad()
    def take(self, model: torch.nn.Module) -> None:
        """Copies of the trained weights as this rank holds them: its shards and the plain ones."""
        self.model = model
        self.shards = [flat.detach().clone() for flat in fsdp_flat_params(model)]
        self.plain = {name: p.detach().clone() for name, p in plain_trained(model).items()}

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor this rank's EMA holds."""
        return [*self.shards, *self.plain.values(), *self.named_buffers_dict.values(), *self.loaded.values()]

    def pairs(self, model: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(EMA tensor, the model's) for every trained weight this rank holds and every buffer."""
        flats = fsdp_flat_params(model)
        if self.shards and len(flats) != len(self.shards):
            raise RuntimeError(f"the EMA holds {len(self.shards)} shards and the model {len(flats)} FSDP units")
        pairs = [(ema, flat.detach()) for ema, flat in zip(self.shards, flats)]
        pairs += [(self.plain[name], p.detach()) for name, p in plain_trained(model).items() if name in self.plain]
        buffers = self.named_buffers_dict
        return pairs + [(buffers[name], b) for name, b in model.named_buffers() if name in buffers]

    @torch.no_grad()
    def update(self, model: torch.nn.Module, smoothing: float) -> None:
        pairs = [(ema, current) for ema, current in self.pairs(model) if current.is_floating_point()]
        if pairs:
            torch._foreach_lerp_([e for e, _ in pairs], [c for _, c in pairs], 1.0 - smoothing)

    @torch.no_grad()
    def swap_params(self, model: torch.nn.Module) -> None:
        """The EMA weights into ``model`` and its weights into the EMA, shard by shard on each rank; gathered weights
        FSDP still holds are let go, so that the next forward reads the shards as they now are."""
        for ema, current in self.pairs(model):
            held = current.clone()
            current.copy_(ema)
            ema.copy_(held)
        fsdp_drop_gathered(model)

    def move_params_to_device(self, destination_model: torch.nn.Module) -> None:
        """When the run starts: a checkpoint's EMA weights into this rank's shards, or the shards onto the device of
        the weights."""
        if self.loaded:
            self.shard_loaded(destination_model)
        flats = fsdp_flat_params(destination_model)
        self.shards = [ema.to(flat.device) for ema, flat in zip(self.shards, flats)]
        buffers = dict(destination_model.named_buffers())
        self.named_buffers_dict = {name: b.to(buffers[name].device) if name in buffers else b
                                   for name, b in self.named_buffers_dict.items()}

    @torch.no_grad()
    def shard_loaded(self, model: torch.nn.Module) -> None:
        """This rank's shards of a checkpoint's EMA weights (``loaded``, whole, by the names of the model it was
        saved from): written into the model's full weights, kept as its shards hold them, and the model's own
        weights put back."""
        from models.checkpoints import model_key
        from models.errors import WorkbenchError

        by_key = {model_key(name): tensor for name, tensor in self.loaded.items()}
        own = [flat.detach().clone() for flat in fsdp_flat_params(model)]
        own_plain = {name: p.detach().clone() for name, p in plain_trained(model).items()}
        fsdp_drop_gathered(model)  # gathered now, not reused from before
        with fsdp_full_params(model):
            for name, p in model.named_parameters():
                if p.requires_grad:
                    if model_key(name) not in by_key:
                        raise WorkbenchError(f"the checkpoint's EMA state holds no {model_key(name)}, which this run "
                                             "trains: resume it with the model it was saved with")
                    p.detach().copy_(by_key[model_key(name)])
        self.take(model)
        for flat, weights in zip(fsdp_flat_params(model), own):
            flat.detach().copy_(weights)
        for name, p in plain_trained(model).items():
            p.detach().copy_(own_plain[name])
        fsdp_drop_gathered(model)
        self.loaded = {}

    @torch.no_grad()
    def full_state(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(parameters, buffers) as Composer's EMA state holds them: every trained weight whole, by the model's
        parameter names, gathered on rank 0 (the other ranks get none: only rank 0's state is written)."""
        from composer.utils import dist

        if self.loaded or not self.shards and not self.plain:
            return dict(self.loaded), dict(self.named_buffers_dict)
        model = self.model
        self.swap_params(model)
        try:
            with fsdp_full_params(model, rank0_only=True):
                weights = {} if dist.get_global_rank() != 0 else {
                    name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters() if p.requires_grad}
        finally:
            self.swap_params(model)
        return weights, dict(self.named_buffers_dict)


class FusedEMA(EMA):
    """Composer's EMA with the fused update, sharded under FSDP (see above)."""

    sharded = False  # set at Event.INIT: the run wraps its model in FSDP

    def match(self, event: Event, state) -> bool:
        if (event == self.update_event and not self.ema_started and self.sharded and self._should_start(state)
                and fsdp_flat_params(state.model)):
            self.ema_model = ShardedEMA(state.model)  # before Composer's, which would copy every weight whole
            self.ema_started = True
        return super().match(event, state)

    def apply(self, event: Event, state, logger) -> None:
        if event == Event.INIT and state.fsdp_config is not None:
            # the model is wrapped after INIT: the EMA is taken from its shards when EMA starts, or from a checkpoint
            self.sharded, self.ema_model = True, ShardedEMA()
            return
        if event in (Event.BATCH_END, Event.EPOCH_END) and self.ema_model is not None:
            if isinstance(self.ema_model, ShardedEMA):
                self.ema_model.update(state.model, self.smoothing)
            else:
                fused_ema_update(state.model, self.ema_model, self.smoothing)
            return
        super().apply(event, state, logger)

    def state_dict(self) -> dict:
        if not isinstance(self.ema_model, ShardedEMA):
            return super().state_dict()
        parameters, buffers = self.ema_model.full_state()
        return {**Algorithm.state_dict(self), "ema_weights_active": self.ema_weights_active,
                "ema_started": self.ema_started,
                "ema_model": {"named_parameters_dict": parameters, "named_buffers_dict": buffers}}

    def load_state_dict(self, state: dict, strict: bool = False) -> None:
        super().load_state_dict(state, strict)
        if self.sharded and isinstance(self.ema_model, EMAParameters):
            loaded = ShardedEMA()
            loaded.loaded = dict(self.ema_model.named_parameters_dict) if self.ema_started else {}
            loaded.named_buffers_dict = dict(self.ema_model.named_buffers_dict)
            self.ema_model = loaded
