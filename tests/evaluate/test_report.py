"""The report's cost of a checkpoint: the columns `dwb evaluate` writes into its rows, else (a store written before
rows carried them) what the checkpoint file records."""
from evaluate.report import checkpoint_costs, cost_axis
from models.checkpoints import checkpoint_cost


def test_a_checkpoints_cost_comes_from_its_rows_else_from_its_file(tiny_run, tmp_path):
    ba2 = tiny_run / "ep0-ba2-rank0.pt"
    gone = tmp_path / "priced" / "ep0-ba6-rank0.pt"  # scored by a run with a price, then deleted: its rows remain
    rows = [dict(model="priced", checkpoint=str(gone), step=6, guidance=5.0, fid=20.0, gpu_hours=0.5, usd=1.25),
            dict(model="priced", checkpoint=str(gone), step=6, guidance=7.5, fid=21.0, gpu_hours=0.5, usd=1.25),
            dict(model="tiny", checkpoint=str(ba2), step=2, guidance=5.0, fid=30.0),  # a store from before the columns
            dict(model="hub", checkpoint="org/model", step=0, guidance=5.0, fid=10.0)]  # records no cost
    hours = checkpoint_cost(ba2)["gpu_hours_total"]
    assert hours > 0
    assert checkpoint_costs(rows) == {str(gone): {"gpu_hours": 0.5, "usd": 1.25}, str(ba2): {"gpu_hours": hours}}
    xkey, have = cost_axis(rows)
    assert xkey == "gpu_hours" and [(r["model"], r["gpu_hours"]) for r in have] == [
        ("priced", 0.5), ("priced", 0.5), ("tiny", hours)]  # the tiny run set no price: dollars would drop it
    assert cost_axis(rows[:2])[0] == "usd"  # every checkpoint priced
    assert cost_axis(rows[3:]) == ("gpu_hours", [])


def test_files_that_record_no_cost_give_rows_no_cost_columns(tiny_run, tmp_path):
    from evaluate.store import checkpoint_cost_columns

    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    assert checkpoint_cost_columns(tmp_path / "model.safetensors") == {}  # a single file: no pickle, no cost
    assert checkpoint_cost_columns(tmp_path) == checkpoint_cost_columns(None) == {}  # a folder, a hub model
    assert checkpoint_cost_columns(tiny_run / "ep0-ba2-rank0.pt")["gpu_hours"] > 0
