"""The one table of metric names: display names, directions, families and ranges, and its copy beside the results."""
import json

from evaluate.names import METRICS_FILE, difference_range, metrics_table, value_range, with_direction
from evaluate.store import ATTRIBUTE_COLUMNS, ResultsStore


def test_the_metric_table_lands_beside_the_results(tmp_path):
    ResultsStore(tmp_path).append({"model": "m", "status": "ok", "fid": 1.0})
    table = json.loads((tmp_path / METRICS_FILE).read_text())
    assert table == metrics_table()
    assert table["fid"] == {"name": "FID", "lower_is_better": True, "family": "image quality", "range": [0, None]}
    assert table["clip_score"]["family"] == "text alignment" and not table["clip_score"]["lower_is_better"]
    for key in ATTRIBUTE_COLUMNS:
        assert table[key]["range"] == [0, 1] and table[key]["family"] == "attribute accuracy"
        assert "_" not in table[key]["name"]  # a name for people, not the column
    assert table["attr_pair_all"]["name"] == "every attribute right (two groups)"


def test_ranges_and_directions():
    assert value_range("kid_mean") == (0, None) and value_range("attr_all_all") == (0, 1)
    assert value_range("seconds_total") == (None, None)  # not a metric: no range
    assert difference_range("attr_single_color") == (-1, 1) and difference_range("fid") == (None, None)
    assert with_direction("fid") == "FID (lower is better)"
    assert with_direction("clip_score") == "CLIP score (higher is better)"
