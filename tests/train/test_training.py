"""Composer end to end on tiny models: fit, checkpoint, resume, phase 2 from phase 1, export, load."""
from pathlib import Path

import numpy as np
import pytest
import torch
from composer import Callback
from diffusers import StableDiffusionPipeline

from models.checkpoints import read_checkpoint
from train.config import load_config
from models.errors import WorkbenchError
from models.checkpoints import export_pipeline, load_pipeline
from train.trainer import build_trainer

from ..conftest import REPO, file_size_limit, tiny_overrides

PHASE1 = REPO / "configs/tiny-phase1.yaml"
PHASE2 = REPO / "configs/tiny-phase2.yaml"


def _unet(state_or_pipe):
    return {k: v.clone() for k, v in state_or_pipe.unet.state_dict().items()}


def test_fit_writes_periodic_checkpoints_with_spec_and_ema(tiny_run):
    names = sorted(p.name for p in tiny_run.glob("ep*-ba*-rank0.pt"))
    assert names == ["ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt"]
    ckpt = read_checkpoint(tiny_run / "ep0-ba4-rank0.pt")  # weights_only=True under the hood
    assert ckpt["spec"]["architecture"] == "tiny" and ckpt["spec"]["resolution"] == 16
    assert ckpt["ema_state"]["ema_started"]
    raw = load_pipeline(tiny_run / "ep0-ba4-rank0.pt")
    ema = load_pipeline(tiny_run / "ep0-ba4-rank0.pt", ema=True)
    diff = sum((a - b).abs().sum().item() for a, b in zip(raw.unet.parameters(), ema.unet.parameters()))
    assert diff > 0  # EMA and raw weights are told apart


def test_autoresume_continues_from_the_latest_checkpoint(shapes_data, components, tmp_path):
    folder = tmp_path / "ckpt"
    over = tiny_overrides(shapes_data, components, folder, save_interval="2ba", autoresume="true", run_name="resume")
    first = build_trainer(load_config(PHASE1, over + ["max_duration=2ba"]))
    first.fit()
    first.close()
    second = build_trainer(load_config(PHASE1, over + ["max_duration=4ba"]))
    assert int(second.state.timestamp.batch) == 2  # picked up where the first run stopped
    second.fit()
    second.close()
    assert int(second.state.timestamp.batch) == 4
    assert (folder / "ep0-ba4-rank0.pt").is_file()


def test_phase2_starts_from_phase1_weights(tiny_run, shapes_data, components, tmp_path):
    # lr 0 and no weight decay: phase 2's single step leaves the loaded weights untouched
    start = tiny_run / "ep0-ba4-rank0.pt"
    over = tiny_overrides(shapes_data, components, tmp_path / "p2", res=32, max_duration="1ba", save_interval="1ba",
                          load_path=start, **{"optimizer.lr": 0.0, "optimizer.weight_decay": 0.0, "ema.enabled": "false"})
    trainer = build_trainer(load_config(PHASE2, over))
    assert int(trainer.state.timestamp.batch) == 0  # weights only: a fresh run, not a resume
    trainer.fit()
    trainer.close()
    stored = read_checkpoint(start)["model"]  # the weights phase 1 saved (EMA, swapped in for saving)
    after = read_checkpoint(tmp_path / "p2" / "ep0-ba1-rank0.pt")
    assert after["spec"]["resolution"] == 32
    unet_keys = [k for k in stored if k.startswith("unet.")]
    assert all(torch.equal(stored[k], after["model"][k]) for k in unet_keys)


def test_load_path_of_another_architecture_is_refused(tiny_run, shapes_data, components, tmp_path):
    over = tiny_overrides(shapes_data, components, tmp_path / "x", load_path=tiny_run / "ep0-ba4-rank0.pt",
                          **{"model.unet": "{block_out_channels: [16, 32]}"})
    with pytest.raises(WorkbenchError, match="UNet differs"):
        build_trainer(load_config(PHASE1, over))


def test_load_path_check_ignores_the_order_of_diffusers_bookkeeping(tiny_run, shapes_data, components, tmp_path):
    """diffusers' ``_use_default_values`` comes from a set: another process (phase 2 started by hand) lists it
    in another order, and that alone must not refuse phase 1's checkpoint."""
    from train.trainer import checked_load_path

    start = tiny_run / "ep0-ba4-rank0.pt"
    spec = read_checkpoint(start)["spec"]
    unet = dict(spec["unet"])
    assert len(unet["_use_default_values"]) > 1
    unet["_use_default_values"] = list(reversed(unet["_use_default_values"]))
    cfg = load_config(PHASE2, tiny_overrides(shapes_data, components, tmp_path / "p2", res=32, load_path=start))
    assert checked_load_path(cfg, {**spec, "unet": unet}) == str(start)  # no error
    with pytest.raises(WorkbenchError, match="UNet differs"):
        checked_load_path(cfg, {**spec, "unet": {**unet, "block_out_channels": [16, 32]}})


def test_export_round_trip_is_bit_identical(tiny_run, tmp_path):
    ckpt = tiny_run / "ep0-ba4-rank0.pt"
    for ema in (False, True):
        out = export_pipeline(ckpt, tmp_path / f"export-{ema}", ema=ema)
        exported = StableDiffusionPipeline.from_pretrained(out)  # plain diffusers, no workbench code
        ours = load_pipeline(ckpt, ema=ema)
        kw = dict(prompt=["two red circles left of a blue square", "a green triangle"], num_inference_steps=6,
                  guidance_scale=4.0, height=16, width=16, output_type="np")
        a = exported(**kw, generator=[torch.Generator().manual_seed(s) for s in (0, 1)]).images
        b = ours(**kw, generator=[torch.Generator().manual_seed(s) for s in (0, 1)]).images
        assert a.shape == (2, 16, 16, 3) and np.array_equal(a, b)
        assert load_pipeline(out).unet.state_dict().keys() == ours.unet.state_dict().keys()


def test_a_full_disk_stops_export_and_training_in_one_line_and_leaves_nothing_torn(tiny_run, shapes_data, components,
                                                                                    tmp_path):
    """Past a file-size limit (EFBIG, as ENOSPC on a full disk): no half export folder, no checkpoint file that
    autoresume would have to find torn later."""
    from train.trainer import train

    with file_size_limit(2**20):  # the tiny VAE's weights alone are 2.7 MB, a checkpoint 20 MB
        with pytest.raises(WorkbenchError) as refused:
            export_pipeline(tiny_run / "ep0-ba4-rank0.pt", tmp_path / "export")
        assert str(refused.value).startswith(f"the disk is full under {tmp_path} (File too large); export not written")
        assert list(tmp_path.iterdir()) == []

        save = tmp_path / "run" / "checkpoints"
        cfg = load_config(PHASE1, tiny_overrides(shapes_data, components, save, max_duration="2ba", save_interval="1ba"))
        with pytest.raises(WorkbenchError) as refused:
            train(cfg)
    assert str(refused.value).startswith(f"the disk is full under {save} (File too large); a checkpoint")
    assert "\n" not in str(refused.value)
    assert [p.name for p in save.iterdir()] == ["ep0-ba1-rank0.pt.corrupt"]  # set aside; no latest link to it


def test_bad_checkpoints_give_one_line_errors(tmp_path):
    corrupt = tmp_path / "ep0-ba9-rank0.pt"
    corrupt.write_bytes(b"not a checkpoint at all")
    with pytest.raises(WorkbenchError, match="corrupt, not a PyTorch file"):
        load_pipeline(corrupt)
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {"w": torch.zeros(1)}}, foreign)
    with pytest.raises(WorkbenchError, match="not a Composer checkpoint"):
        load_pipeline(foreign)
    composer_like = tmp_path / "composer-like.pt"
    torch.save({"state": {"model": {"w": torch.zeros(1)}}}, composer_like)
    with pytest.raises(WorkbenchError, match="neither a diffusion-workbench checkpoint .* nor a mosaicml/diffusion one"):
        load_pipeline(composer_like)
    with pytest.raises(WorkbenchError, match="checkpoint not found"):
        load_pipeline(tmp_path / "missing.pt")
    with pytest.raises(WorkbenchError, match="model_index.json missing"):
        load_pipeline(tmp_path)


def test_bad_data_paths_fail_before_training(shapes_data, components, tmp_path):
    with pytest.raises(WorkbenchError, match=r"'data.path': no MDS dataset at"):
        build_trainer(load_config(PHASE1, tiny_overrides(tmp_path / "nodata", components, tmp_path / "c")))
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "blocker").write_text("a file where a folder should be")
    with pytest.raises(WorkbenchError, match="'save_folder': cannot write"):
        build_trainer(load_config(PHASE1, tiny_overrides(shapes_data, components, ro / "blocker" / "ckpt")))


def test_gpu_only_features_are_refused_on_cpu(shapes_data, components, tmp_path):
    """FSDP trains on CPU ranks (tests/train/test_fsdp.py); mixed precision and the rest need a GPU."""
    for key in ("low_precision_norms=true", "model.attention=xformers", "device_train_microbatch_size=auto",
                "precision=amp_bf16", "precision=amp_fp16"):
        over = tiny_overrides(shapes_data, components, tmp_path / "c") + [key, "device=cpu"]
        with pytest.raises(WorkbenchError, match="needs a CUDA GPU"):
            build_trainer(load_config(PHASE1, over))


def test_empty_dataset_is_refused(components, tmp_path):
    from models.datasets.mds import open_writer

    open_writer(tmp_path / "empty" / "16").finish()
    over = tiny_overrides(tmp_path / "empty", components, tmp_path / "c")
    with pytest.raises(WorkbenchError, match="'data.path': the dataset at .* is empty"):
        build_trainer(load_config(PHASE1, over))


def test_cli_export_and_sample(tiny_run, tmp_path, dwb):
    from PIL import Image

    ckpt = tiny_run / "ep0-ba4-rank0.pt"
    r = dwb("export", str(ckpt), str(tmp_path / "exp"), "--ema")
    assert r.returncode == 0 and "exported EMA weights" in r.stdout, r.stderr
    assert (tmp_path / "exp" / "unet" / "diffusion_pytorch_model.safetensors").is_file()
    again = dwb("export", str(ckpt), str(tmp_path / "exp"))
    assert again.returncode == 1 and "is not empty" in again.stderr  # never overwrites an export
    auto = dwb("export", str(ckpt), str(tmp_path / "auto"))  # the default, as every command opens a checkpoint
    assert auto.returncode == 0 and "exported EMA weights" in auto.stdout, auto.stderr
    unet = Path("unet") / "diffusion_pytorch_model.safetensors"
    assert (tmp_path / "auto" / unet).read_bytes() == (tmp_path / "exp" / unet).read_bytes()
    r = dwb("sample", str(tmp_path / "exp"), str(tmp_path / "grid.png"), "--prompt", "a red circle",
            "--prompt", "two blue squares", "--seeds", "3", "--steps", "2")
    assert r.returncode == 0, r.stderr
    grid = Image.open(tmp_path / "grid.png")
    assert grid.size == (300 + 3 * 96, 24 + 2 * 96)


@pytest.mark.parametrize("name", ["constant_with_warmup", "linear_with_warmup", "cosine_with_warmup"])
def test_scheduler_choice_shapes_the_learning_rate(name, shapes_data, components, tmp_path):
    over = tiny_overrides(shapes_data, components, tmp_path / "ckpt", max_duration="8ba", save_interval="8ba",
                          **{"scheduler.name": name, "scheduler.t_warmup": "1ba", "scheduler.alpha_f": 0.1,
                             "optimizer.lr": 1e-3})
    trainer = build_trainer(load_config(PHASE1, over))
    lrs = []

    class RecordLR(Callback):  # the lr each batch trains with
        def before_forward(self, state, logger):
            lrs.append(state.optimizers[0].param_groups[0]["lr"])

    trainer.state.callbacks.append(RecordLR())
    trainer.fit()
    trainer.close()
    peak = lrs.index(max(lrs))
    assert len(lrs) == 8 and lrs[0] == 0.0 and max(lrs) == pytest.approx(1e-3) and peak <= 2  # short warm-up
    if name == "constant_with_warmup":
        assert lrs[peak:] == pytest.approx([1e-3] * (8 - peak))
    else:  # decays towards alpha_f x lr at max_duration, monotonically
        assert all(a > b for a, b in zip(lrs[peak:], lrs[peak + 1:]))
        assert 1e-4 <= lrs[-1] < 4e-4


def test_unknown_scheduler_is_a_config_error(shapes_data, components, tmp_path):
    with pytest.raises(WorkbenchError, match="scheduler.name"):
        load_config(PHASE1, tiny_overrides(shapes_data, components, tmp_path / "c", **{"scheduler.name": "step"}))
    with pytest.raises(WorkbenchError, match="scheduler.alpha_f"):
        load_config(PHASE1, tiny_overrides(shapes_data, components, tmp_path / "c", **{"scheduler.alpha_f": 1.5}))
