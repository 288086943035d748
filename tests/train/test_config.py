from pathlib import Path

import pytest

from train.config import load_config
from models.errors import WorkbenchError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml") if not p.name.startswith("evaluate-")))
def test_shipped_configs_load_and_round_trip(name, tmp_path):
    """What a run writes beside its checkpoints (config.yaml) loads back to the same config."""
    import yaml

    from train.config import config_to_dict

    cfg = load_config(CONFIGS / name)
    from models.checkpoints import ARCHITECTURES

    assert cfg.run_name and cfg.max_duration and cfg.model.architecture in ARCHITECTURES
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


@pytest.mark.parametrize("override, refusal", [
    # the measured attacks: each ran to rc 0 (uphill training, EMA weights of 6.5e4 saved as the model, no checkpoint)
    ("grad_clip_norm=-1", "'grad_clip_norm' must be in (0, 1000000] (null turns clipping off), got -1.0"),
    ("ema.smoothing=2", "'ema.smoothing' must be in (0, 1), got 2.0"),
    ("save_interval=0ba", "'save_interval' must be a Composer time > 0 such as '1000ba' or '1ep', got '0ba'"),
    # every other number and duration a run cannot mean
    ("grad_clip_norm=0", "'grad_clip_norm' must be in (0, 1000000] (null turns clipping off), got 0.0"),
    ("ema.smoothing=0", "'ema.smoothing' must be in (0, 1), got 0.0"),
    ("ema.update_interval=0ba", "'ema.update_interval' must be a Composer time > 0 such as '1000ba' or '1ep', got '0ba'"),
    ("ema.update_interval=10sp", "'ema.update_interval' must be a Composer time in ba, ep, got '10sp'"),
    ("ema.ema_start=-5ba", "'ema.ema_start' must be a Composer time >= 0 such as '0ba' or '1ep', got '-5ba'"),
    ("optimizer.lr=-1e-4", "'optimizer.lr' must be in [0, 1], got -0.0001"),
    ("optimizer.lr=.nan", "'optimizer.lr' must be in [0, 1], got nan"),
    ("optimizer.betas=[0.9, 1.0]", "'optimizer.betas' must be 2 values, each in [0, 1), got [0.9, 1.0]"),
    ("optimizer.betas=[0.9]", "'optimizer.betas' must be 2 values, each in [0, 1), got [0.9]"),
    ("optimizer.eps=0", "'optimizer.eps' must be in (0, 1], got 0.0"),
    ("optimizer.weight_decay=-0.01", "'optimizer.weight_decay' must be in [0, 10], got -0.01"),
    ("model.caption_dropout=1.5", "'model.caption_dropout' must be in [0, 1), got 1.5"),
    ("model.other_phrasing=-0.1", "'model.other_phrasing' must be in [0, 1], got -0.1"),
    ("model.min_snr_gamma=0", "'model.min_snr_gamma' must be in (0, 1000] (null turns the weighting off), got 0.0"),
    ("scheduler.t_warmup=-1ba", "'scheduler.t_warmup' must be a Composer time >= 0 such as '0ba' or '1ep', got '-1ba'"),
    ("scheduler.alpha_f=2", "'scheduler.alpha_f' must be in [0, 1], got 2.0"),
    ("max_duration=0ba", "'max_duration' must be a Composer time > 0 such as '1000ba' or '1ep', got '0ba'"),
    ("max_duration=0.5dur", "'max_duration' must be a Composer time in ba, ep, sp, tok, got '0.5dur'"),
    ("log_interval=0ba", "'log_interval' must be a Composer time > 0 such as '1000ba' or '1ep', got '0ba'"),
    ("save_interval=2dur", "'save_interval' must be a fraction of the run, at most 1dur, got '2dur'"),
    ("global_train_batch_size=0", "'global_train_batch_size' must be in [1, 1048576], got 0"),
    ("device_train_microbatch_size=0", "'device_train_microbatch_size' must be an integer in [1, 1048576] or 'auto', got 0"),
    ("save_num_checkpoints_to_keep=-2", "'save_num_checkpoints_to_keep' must be in [-1, 16777216] (-1 keeps every checkpoint), got -2"),
    ("max_consecutive_nonfinite=0", "'max_consecutive_nonfinite' must be in [1, 16777216], got 0"),
    ("dist_timeout=5", "'dist_timeout' must be in [10, 86400], got 5.0"),
    ("seed=-1", "'seed' must be in [0, 4294967295], got -1"),
    ("data.num_workers=-1", "'data.num_workers' must be in [0, 256], got -1"),
    ("data.predownload=-8", "'data.predownload' must be in [0, 16777216], got -8"),
    ("data.num_canonical_nodes=0", "'data.num_canonical_nodes' must be in [1, 65536], got 0"),
    ("data.streams=[{path: a, proportion: -0.5}, {path: b, proportion: 1.5}]",
     "'data.streams[0].proportion' must be in [0, 1], got -0.5"),
    ("loggers=[file, csv]", "'loggers' must be a list of values, each one of file, tensorboard, wandb, got ['file', 'csv']"),
])
def test_out_of_range_values_are_refused_with_key_value_and_range(override, refusal):
    extra = ["data.path="] if override.startswith("data.streams") else []
    with pytest.raises(WorkbenchError) as refused:
        load_config(CONFIGS / "tiny-phase1.yaml", [override, *extra])
    assert str(refused.value) == f"config key {refusal}"


@pytest.mark.parametrize("override,loaded", [
    ("grad_clip_norm=null", {"grad_clip_norm": None}),  # no clipping
    ("model.min_snr_gamma=null", {"model.min_snr_gamma": None}),  # no min-SNR weighting
    ("scheduler.t_warmup=0ba", {"scheduler.t_warmup": "0ba"}),  # no warm-up
    ("ema.ema_start=0ba", {"ema.ema_start": "0ba"}),  # EMA from the first batch
    ("model.caption_dropout=0", {"model.caption_dropout": 0.0}),  # every caption kept
    ("model.other_phrasing=1", {"model.other_phrasing": 1.0}),  # always the other phrasing
    ("optimizer.lr=0", {"optimizer.lr": 0.0}),  # weights left as they are
    ("optimizer.weight_decay=0", {"optimizer.weight_decay": 0.0}),  # no decay
    ("optimizer.betas=[0,0.5]", {"optimizer.betas": [0.0, 0.5]}),  # no momentum
    ("scheduler.alpha_f=1", {"scheduler.alpha_f": 1.0}),  # no decay of the lr
    ("data.num_workers=0", {"data.num_workers": 0}),  # samples read in the training process
    ("data.predownload=0", {"data.predownload": 0}),  # none fetched ahead
    ("save_num_checkpoints_to_keep=-1", {"save_num_checkpoints_to_keep": -1}),  # every checkpoint kept
    ("save_interval=0.5dur", {"save_interval": "0.5dur"}),  # half the run
    ("seed=0", {"seed": 0}),
    ("device_train_microbatch_size=auto", {"device_train_microbatch_size": "auto"}),  # Composer finds it
    ("device_train_microbatch_size=16", {"device_train_microbatch_size": 16}),
    ("save_folder=s3://bucket/run save_num_checkpoints_to_keep=0",  # none kept here: the bucket keeps them
     {"save_folder": "s3://bucket/run", "save_num_checkpoints_to_keep": 0}),
])
def test_values_that_mean_off_none_or_all_still_load(override, loaded):
    """Each loads as the value given, of its own type (0 for "off", null for "none", -1 for "all"), not as the
    config file's value or a default."""
    from functools import reduce

    cfg = load_config(CONFIGS / "tiny-phase1.yaml", override.split(" "))
    for key, value in loaded.items():
        got = reduce(getattr, key.split("."), cfg)
        assert got == value and type(got) is type(value), (key, got)
        if type(value) is list:
            assert [type(v) for v in got] == [type(v) for v in value], (key, got)


def test_microbatches_split_each_process_batch(monkeypatch):
    """A microbatch that does not divide a process's batch (or exceeds it) is a global and a per-device size
    taken for each other; `composer -n N` sets WORLD_SIZE before the config is read."""
    with pytest.raises(WorkbenchError, match=r"'device_train_microbatch_size' \(48\) must divide each process's batch"):
        load_config(CONFIGS / "tiny-phase1.yaml", ["device_train_microbatch_size=48"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    load_config(CONFIGS / "tiny-phase1.yaml", ["device_train_microbatch_size=32"])
    with pytest.raises(WorkbenchError, match=r"\(64\) must divide each process's batch .*64 over 2 processes: 32"):
        load_config(CONFIGS / "tiny-phase1.yaml", ["device_train_microbatch_size=64"])
    with pytest.raises(WorkbenchError, match=r"'global_train_batch_size' \(63\) must divide by the number of processes"):
        load_config(CONFIGS / "tiny-phase1.yaml", ["global_train_batch_size=63", "device_train_microbatch_size=1"])


def test_keeping_no_checkpoint_in_a_local_folder_is_refused():
    with pytest.raises(WorkbenchError, match="'save_num_checkpoints_to_keep' is 0, which deletes every checkpoint"):
        load_config(CONFIGS / "tiny-phase1.yaml", ["save_num_checkpoints_to_keep=0"])


def test_every_number_and_duration_key_has_a_rule():
    """One place for ranges: each numeric or time-string key of every section carries its rule."""
    import dataclasses
    import typing

    from train.config import TrainConfig
    from models.common import RULE

    def keys(cls, prefix=""):
        for f in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[f.name]
            inner = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
            if dataclasses.is_dataclass(inner[0]) or (typing.get_args(inner[0]) and
                                                      dataclasses.is_dataclass(typing.get_args(inner[0])[0])):
                yield from keys(inner[0] if dataclasses.is_dataclass(inner[0]) else typing.get_args(inner[0])[0],
                                f"{prefix}{f.name}.")
            else:
                yield prefix + f.name, inner, f

    numeric = {key: f for key, inner, f in keys(TrainConfig)
               if any(t in (int, float) or typing.get_args(t) == (float,) for t in inner)
               or key.endswith(("duration", "interval", "warmup", "start"))}
    assert {"optimizer.lr", "ema.smoothing", "save_interval", "grad_clip_norm", "data.streams.proportion"} <= set(numeric)
    assert [key for key, f in numeric.items() if f.metadata.get(RULE) is None] == []


def _numeric_rules():
    """(key, rule, is_int) of every numeric key of every section, list items' sections included."""
    import dataclasses
    import typing

    from models.common import RULE
    from train.config import TrainConfig

    def walk(cls, prefix=""):
        for f in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[f.name]
            union = typing.get_origin(tp) is typing.Union
            inner = [a for a in typing.get_args(tp) if a is not type(None)] if union else [tp]
            item = typing.get_args(inner[0])[0] if typing.get_origin(inner[0]) is list else inner[0]
            if dataclasses.is_dataclass(item):
                yield from walk(item, f"{prefix}{f.name}.")
            elif inner[0] in (int, float) or item in (int, float):
                yield prefix + f.name, f.metadata.get(RULE), int in (inner[0], item), item is not inner[0]

    return list(walk(TrainConfig))


def test_every_numeric_key_has_a_finite_range():
    """Infinity, NaN and a trillion are outside every numeric key's range (a list's rule is asked of a list):
    weight_decay=.inf trained to 58% non-finite weights and exited 0, a batch of 1e12 hung."""
    rules = _numeric_rules()
    assert {"optimizer.lr", "optimizer.weight_decay", "cost.usd_per_gpu_hour", "global_train_batch_size",
            "data.resolution", "previews.guidance", "validation.batch_size"} <= {key for key, *_ in rules}
    for key, rule, is_int, is_list in rules:
        bad = [10**12] if is_int else [float("inf"), float("-inf"), float("nan"), 1e12]
        for value in bad:
            assert rule((value,) if is_list else value) is not None, f"{key} admits {value}"


@pytest.mark.parametrize("override, key", [
    ("optimizer.lr=.inf", "optimizer.lr"), ("optimizer.weight_decay=.inf", "optimizer.weight_decay"),
    ("cost.usd_per_gpu_hour=.inf", "cost.usd_per_gpu_hour"),
    ("global_train_batch_size=1000000000000", "global_train_batch_size"),
    ("data.resolution=65536", "data.resolution"), ("previews.prompts=[]", "previews.prompts"),
    ("previews.seeds=[]", "previews.seeds"), ("validation.timesteps=[]", "validation.timesteps"),
    ("previews.prompts=['']", "previews.prompts"),
])
def test_values_no_run_can_use_are_refused_by_name(override, key):
    """Each was accepted: weight_decay=.inf exited 0 with non-finite weights, batch 1e12 hung, resolution
    65536 asked for 2^32 pixels an image, no preview prompt crashed at the first preview."""
    with pytest.raises(WorkbenchError) as refused:
        load_config(CONFIGS / "tiny-phase1.yaml", [override])
    assert str(refused.value).startswith(f"config key '{key}' must be ")


def test_an_empty_held_out_split_is_one_line(tmp_path):
    """An MDS split with no sample: Streaming's IndexError before, now the key and the reason."""
    from streaming import MDSWriter

    from train.callbacks.validation import read_held_out

    with MDSWriter(out=str(tmp_path / "eval"), columns={"image": "bytes", "caption": "str"}):
        pass
    with pytest.raises(WorkbenchError, match=r"^config key 'validation.path' \(.*\): the MDS dataset holds no samples$"):
        read_held_out(str(tmp_path / "eval"), 16, 64, 0, 1)


def test_out_of_range_training_value_stops_dwb_train_in_one_line(dwb, tmp_path):
    """The attacks as run: `dwb train` stops before anything is built, with one line and no run folder."""
    for override in ("grad_clip_norm=-1", "ema.smoothing=2", "save_interval=0ba"):
        save = tmp_path / override.split("=")[0] / "checkpoints"
        r = dwb("train", str(CONFIGS / "tiny-phase1.yaml"), override, f"save_folder={save}")
        assert r.returncode != 0 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
        assert r.stderr.startswith(f"error: config key '{override.split('=')[0]}' must be ")
        assert not save.parent.exists()
