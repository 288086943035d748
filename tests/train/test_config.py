from pathlib import Path

import pytest

from train.config import load_config
from train.errors import WorkbenchError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml") if not p.name.startswith("evaluate-")))
def test_shipped_configs_load_and_round_trip(name, tmp_path):
    """What a run writes beside its checkpoints (config.yaml) loads back to the same config."""
    import yaml

    from train.config import config_to_dict

    cfg = load_config(CONFIGS / name)
    assert cfg.run_name and cfg.max_duration and cfg.model.architecture in ("tiny", "sd2-base")
    written = tmp_path / "config.yaml"
    written.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    assert load_config(written) == cfg


def test_sd2_recipe_is_visible_in_configs():
    p1 = load_config(CONFIGS / "sd2-base-phase1.yaml")
    p2 = load_config(CONFIGS / "sd2-base-phase2.yaml")
    assert (p1.data.resolution, p2.data.resolution) == (256, 512)
    assert (p1.max_duration, p2.max_duration) == ("550000ba", "850000ba")
    for cfg in (p1, p2):
        assert cfg.global_train_batch_size == 2048 and cfg.device_train_microbatch_size == 16
        assert cfg.optimizer.lr == 1e-4 and cfg.optimizer.weight_decay == 0.01
        assert cfg.scheduler.t_warmup == "10000ba" and cfg.save_interval == "10000ba"
        assert cfg.fsdp and cfg.low_precision_norms and cfg.model.architecture == "sd2-base"
    assert not p1.ema.enabled
    assert p2.ema.enabled and p2.ema.smoothing == 0.9999 and p2.ema.ema_start == "800000ba"
    assert p2.load_path and p2.load_weights_only


def test_overrides_apply_with_types():
    cfg = load_config(CONFIGS / "tiny-phase1.yaml", ["max_duration=7ba", "optimizer.lr=1e-3", "model.min_snr_gamma=null",
                                                      "device_train_microbatch_size=auto"])
    assert cfg.max_duration == "7ba" and cfg.optimizer.lr == 1e-3
    assert cfg.model.min_snr_gamma is None and cfg.device_train_microbatch_size == "auto"


@pytest.mark.parametrize("override, needle", [
    ("model.colour=red", "unknown config key 'model.colour'"),
    ("max_epochs=3", "unknown config key 'max_epochs'"),
    ("global_train_batch_size=big", "'global_train_batch_size' must be an integer"),
    ("model.prediction_type=x0", "'model.prediction_type' must be one of"),
    ("max_duration=forever", "'max_duration' must be a Composer time string"),
    ("data.resolution=30", "'data.resolution' must be a positive multiple of 8"),
    ("ema.enabled=maybe", "'ema.enabled' must be true or false"),
    ("nonsense", "not of the form key=value"),
])
def test_bad_overrides_name_the_key(override, needle):
    with pytest.raises(WorkbenchError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_config(CONFIGS / "tiny-phase1.yaml", [override])


def test_missing_and_malformed_config_files(tmp_path):
    with pytest.raises(WorkbenchError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed")
    with pytest.raises(WorkbenchError, match="not valid YAML"):
        load_config(bad)
