"""Mixing MDS datasets with Streaming's Stream: proportions, repeats, and config errors by name."""
from collections import Counter

import pytest

from train.config import DataConfig, load_config
from models.datasets import StreamConfig
from train.data.loader import make_dataset
from models.errors import WorkbenchError

from ..conftest import REPO


def _epoch_sources(cfg: DataConfig, boundary: int) -> Counter:
    ds = make_dataset(cfg, batch_size=8, seed=3, with_ids=True)
    return Counter("a" if s["sample_id"] < boundary else "b" for s in ds)


def test_proportions_and_repeats_set_each_streams_share(shapes_data):
    a, b = str(shapes_data / "16"), str(shapes_data / "32")  # 192 samples each
    mixed = DataConfig(resolution=16, streams=[StreamConfig(path=a, proportion=0.75), StreamConfig(path=b, proportion=0.25)])
    counts = _epoch_sources(mixed, 192)
    assert abs(counts["a"] - 288) <= 1 and abs(counts["b"] - 96) <= 1  # 384 samples per epoch, split 3:1
    repeated = DataConfig(resolution=16, streams=[StreamConfig(path=a, repeat=2), StreamConfig(path=b, repeat=0.5)])
    counts = _epoch_sources(repeated, 192)
    assert counts["a"] == 384 and counts["b"] == 96
    plain = DataConfig(resolution=16, streams=[StreamConfig(path=a), StreamConfig(path=b)])
    assert _epoch_sources(plain, 192) == Counter(a=192, b=192)


def test_mixing_precomputed_streams_of_different_encoders_is_refused(shapes_data, components, tmp_path):
    from train.data.precompute import precompute_latents

    kw = dict(vae_ref=str(components), text_encoder_ref=str(components), tokenizer_ref=str(components),
              resolutions=[16], chunk_size=1000, progress=False)
    precompute_latents(str(shapes_data), str(tmp_path / "f16"), dtype="float16", **kw)
    precompute_latents(str(shapes_data), str(tmp_path / "f32"), dtype="float32", **kw)
    import json

    meta_file = tmp_path / "f32" / "16" / "precompute.json"
    meta = json.loads(meta_file.read_text())
    meta["vae"]["fingerprint"] = "0" * 16
    meta_file.write_text(json.dumps(meta))
    from train.data.loader import latent_meta

    cfg = DataConfig(resolution=16, precomputed=True, streams=[StreamConfig(path=str(tmp_path / "f16" / "16")),
                                                              StreamConfig(path=str(tmp_path / "f32" / "16"))])
    with pytest.raises(WorkbenchError, match=r"data.streams\[1\].*another vae"):
        latent_meta(cfg)


@pytest.mark.parametrize("streams,needle", [
    ("[{path: a, proportion: 0.7}, {path: b, proportion: 0.7}]", "sum to 1.4"),
    ("[{path: a, proportion: 0.5}, {path: b}]", "every stream or for none"),
    ("[{path: a, proportion: 1.0}, {path: b, repeat: 2}]", "proportion"),
    ("[{path: a, proportion: 0.5, repeat: 2}]", "at most one"),
    ("[{path: a, repeat: -1}]", "'data.streams[0].repeat' must be in [0, 1000000], got -1.0"),
    ("[{proportion: 1.0}]", "needs a path or a remote"),
    ("[{path: a, weight: 2}]", "unknown config key 'data.streams[0].weight'"),
])
def test_stream_config_errors_name_the_cause(streams, needle):
    with pytest.raises(WorkbenchError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        load_config(REPO / "configs/tiny-phase1.yaml", [f"data.streams={streams}", "data.path="])


def test_streams_and_path_exclude_each_other():
    with pytest.raises(WorkbenchError, match="exclude each other"):
        load_config(REPO / "configs/tiny-phase1.yaml", ["data.streams=[{path: a}]", "data.path=b"])
