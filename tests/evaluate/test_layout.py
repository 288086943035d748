"""The folder and file names evaluate writes under OUT: the names already on users' disks must not change."""
from pathlib import Path

from evaluate.layout import (category_file_stem, comparison_file, comparison_page, grid_file, safe_path_part,
                             samples_folder)
from evaluate.prompts import read_prompt_table

from ..conftest import PROMPT_SETS


def test_the_demos_sample_folders_and_grids_keep_their_names():
    # `dwb demo` labels checkpoints phase/ba<step> and scores at guidance 3 with the checkpoint's own sampler
    assert samples_folder("phase1/ba2", 3.0) == Path("samples/phase1_ba2/cfg3")
    assert samples_folder("phase2/ba300", 3.0, None) == Path("samples/phase2_ba300/cfg3")
    folder = Path("eval") / samples_folder("phase2/ba4", 3.0)
    assert [grid_file(folder, c) for c in ("one group", "two groups")] == [
        Path("eval/samples/phase2_ba4/cfg3/grids/one-group.png"), Path("eval/samples/phase2_ba4/cfg3/grids/two-groups.png")]


def test_labels_samplers_and_categories_keep_their_rules():
    assert samples_folder("run/ep0-ba2-rank0", 7.5, "DPM++ 2M Karras") == Path("samples/run_ep0-ba2-rank0/cfg7.5-DPM_2M_Karras")
    assert safe_path_part("stabilityai/stable-diffusion-2-base") == "stabilityai_stable-diffusion-2-base"
    assert safe_path_part("Euler a") == "Euler_a" and safe_path_part("v1.5-ema") == "v1.5-ema"
    assert comparison_file("out", "run/ep0-ba2-rank0", "run/ep0-ba4-rank0", 5.0) == Path(
        "out/compare/run_ep0-ba2-rank0-vs-run_ep0-ba4-rank0-cfg5.json")
    assert comparison_page("out", "run/ep0-ba2-rank0", "run/ep0-ba4-rank0") == Path(
        "out/compare/run_ep0-ba2-rank0-vs-run_ep0-ba4-rank0.html")
    stems = {p.category: category_file_stem(p.category) for p in read_prompt_table(PROMPT_SETS / "drawbench.csv")}
    assert stems["Gary Marcus et al."] == "gary-marcus-et-al" and stems["DALL-E"] == "dall-e"
    assert all(s and s == s.lower() and " " not in s for s in stems.values())
    assert category_file_stem("") == "uncategorised" and category_file_stem("Food & Beverage") == "food-beverage"
