"""Numbers too large for what they count: a bucket set of 10^8 buckets (`dwb data convert --aspect-buckets`), a run
of 10^23 batches or a warm-up no run reaches, and digit strings past Python's 4,300-digit conversion limit in a
config. Each is refused in one line naming the flag or key, before any work."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from train.config import load_config
from models.generation import bucket_set
from models.errors import WorkbenchError

from ..conftest import DWB, REPO, run_with_peak_memory

MiB = 2**20
CONFIGS = REPO / "configs"
INT_LIMIT_WORDS = ("Exceeds the limit", "set_int_max_str_digits", "int too large")  # Python's own texts


def small_images(folder: Path, count: int = 5) -> Path:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (48 + 8 * i, 64, 3), dtype=np.uint8)).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"image {i}")
    return folder


def test_a_bucket_set_of_a_hundred_million_buckets_is_refused_in_one_line_within_1_5_gib(tmp_path):
    """`--buckets 1000000 --bucket-step 8 --max-aspect 1000000` asked for 1.25e8 buckets: 21.5 GB, and the kernel's
    OOM killer. Run as users run it, with at most 1.5 GiB of data memory (RLIMIT_DATA)."""
    src, out = small_images(tmp_path / "src"), tmp_path / "out"
    run, peak = run_with_peak_memory("prlimit", f"--data={1536 * MiB}", str(DWB), "data", "convert", str(src), str(out),
                                     "--aspect-buckets", "--buckets", "1000000", "--bucket-step", "8",
                                     "--max-aspect", "1000000", "--workers", "1")
    assert run.returncode == 1, run.stderr
    [line] = run.stderr.splitlines()
    assert line.startswith("error: ") and "--max-aspect" in line and "1000000" in line, line
    assert "at most 4" in line, line  # the bound, so the user knows what to ask for
    assert not out.exists()  # refused before any folder is written
    assert peak < 1536 * MiB, f"peak resident memory {peak / MiB:.0f} MiB"


@pytest.mark.parametrize("flags, words", [
    (["--buckets", "4096", "--bucket-step", "8", "--max-aspect", "4"], "--bucket-step"),  # 1,025 buckets
    (["--buckets", "99999999999999999999992", "--bucket-step", "8"], "--buckets"),  # a budget of 10^23 px a side
    (["--buckets", ",".join(str(8 * k) for k in range(1, 513)), "--bucket-step", "8"], "--buckets"),  # 512 budgets
])
def test_bucket_sets_past_the_bound_are_refused_before_any_image_is_read(dwb, tmp_path, flags, words):
    src, out = small_images(tmp_path / "src"), tmp_path / "out"
    run = dwb("data", "convert", str(src), str(out), "--aspect-buckets", "--workers", "1", *flags)
    assert run.returncode == 1, run.stderr
    [line] = run.stderr.strip().splitlines()
    assert words in line and "at most" in line, line
    assert not out.exists()


def test_the_bounds_keep_the_sets_trainers_use():
    """SDXL's published list reaches 1:4 at 1024 px on a step of 64; the defaults and the finer steps the docs
    show stay within the bound, and `dwb sample --aspect 4:1` still finds its bucket on a step of 8."""
    from models.generation import aspect_bucket
    from train.data.convert import _aspect_buckets

    sdxl = bucket_set(1024, 64, 4.0)
    assert (2048, 512) in sdxl and (512, 2048) in sdxl
    for sides, step, aspect in (((256, 512, 1024), None, None), ((1024,), 64, 4.0), ((512,), 32, 2.0), ((64,), 8, 4.0)):
        assert _aspect_buckets(sides, True, step, aspect)
    assert aspect_bucket((4, 1), 1024, 8) == max(bucket_set(1024, 8, 4.0), key=lambda b: b[0] / b[1])


# -- training configs ------------------------------------------------------------------------------

@pytest.mark.parametrize("override, key", [
    ("max_duration=99999999999999999999999ba", "max_duration"),  # trained "forever"
    ("scheduler.t_warmup=1e23ba", "scheduler.t_warmup"),  # trained at lr ~ 0 and exited 0
    ("max_duration=1e30sp", "max_duration"),
    ("ema.ema_start=100000000000ep", "ema.ema_start"),
])
def test_durations_no_run_reaches_are_refused_at_load(override, key):
    with pytest.raises(WorkbenchError) as refused:
        load_config(CONFIGS / "tiny-phase1.yaml", [override])
    message = str(refused.value)
    assert "\n" not in message and f"'{key}'" in message and "at most" in message, message


def test_the_longest_durations_a_run_can_mean_still_load():
    cfg = load_config(CONFIGS / "tiny-phase1.yaml", ["max_duration=10000000000ba", "scheduler.t_warmup=1000000ba"])
    assert (cfg.max_duration, cfg.scheduler.t_warmup) == ("10000000000ba", "1000000ba")


def test_dwb_train_refuses_a_duration_of_10_to_the_23_batches_in_one_line(dwb):
    run = dwb("train", str(CONFIGS / "tiny-phase1.yaml"), "max_duration=99999999999999999999999ba")
    assert run.returncode == 1
    [line] = run.stderr.strip().splitlines()
    assert line.startswith("error: config key 'max_duration'") and "10000000000" in line, line


LONG = "9" * 5000


@pytest.mark.parametrize("override, key", [
    (f"seed={LONG}", "seed"),  # YAML's int() raised Python's 4,300-digit limit, a raw ValueError
    (f"optimizer.lr={'9' * 400}", "optimizer.lr"),  # an int too large for a float: OverflowError
    (f"max_duration={LONG}ba", "max_duration"),
    (f"eval_interval={LONG}ba", "eval_interval"),  # the batches rule's int()
    (f"seed={'9' * 4000}", "seed"),
])
def test_long_digit_strings_in_overrides_are_one_line_naming_the_key(override, key):
    with pytest.raises(WorkbenchError) as refused:
        load_config(CONFIGS / "tiny-phase1.yaml", [override])
    message = str(refused.value)
    assert "\n" not in message and key in message and len(message) < 400, message
    assert not any(words in message for words in INT_LIMIT_WORDS), message


def test_a_config_file_with_a_5000_digit_number_names_the_file(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text((CONFIGS / "tiny-phase1.yaml").read_text() + f"\nseed: {LONG}\n")
    with pytest.raises(WorkbenchError) as refused:
        load_config(path)
    message = str(refused.value)
    assert "\n" not in message and str(path) in message and len(message) < 400 + len(str(path)), message
    assert not any(words in message for words in INT_LIMIT_WORDS), message


def test_a_date_that_cannot_be_is_one_line_naming_the_key():
    """YAML reads 2024-13-45 as a date and its constructor raised Python's own ValueError ("month must be in
    1..12"), as it raised the int-limit text."""
    with pytest.raises(WorkbenchError) as refused:
        load_config(CONFIGS / "tiny-phase1.yaml", ["run_name=2024-13-45"])
    message = str(refused.value)
    assert "\n" not in message and "'run_name'" in message and "2024-13-45" in message and "quote" in message, message
