"""`dwb evaluate watch RUN` started beside a training that has not created RUN yet: it waits for the folder,
saying so once, and with ``--max-wait`` stops with one line when the folder never comes."""
import threading
import time

import pytest

from evaluate.store import ResultsStore
from evaluate.watch import Watcher
from models.errors import WorkbenchError


def watcher(run, tmp_path, seen: list) -> Watcher:
    return Watcher(run, ResultsStore(tmp_path / "results"), seen.append,
                   lambda ckpt, e: seen.append(ckpt), settle=0)


def test_a_run_that_never_appears_stops_after_max_wait_with_one_line(tmp_path, capsys):
    run = tmp_path / "runs" / "not-yet"
    with pytest.raises(WorkbenchError) as refused:
        watcher(run, tmp_path, []).run_forever(interval=0.05, max_polls=1, max_wait=0.2)
    assert str(refused.value) == f"run folder {run} did not appear within 0.2 s (--max-wait)"
    assert capsys.readouterr().out.count("waiting for the run folder") == 1


def test_a_run_created_after_the_watcher_started_is_watched(tmp_path, capsys):
    run, seen = tmp_path / "runs" / "later", []

    def training_starts() -> None:
        # The folder appears with its checkpoint in one rename: the single poll after the wait must find it
        # however late this thread is scheduled (made in place, a busy machine let the poll see it empty).
        made = tmp_path / "being-made"
        (made / "checkpoints").mkdir(parents=True)
        (made / "checkpoints" / "ep0-ba2-rank0.pt").write_bytes(b"torn")  # a checkpoint, as far as a listing goes
        time.sleep(0.3)
        run.parent.mkdir()
        made.rename(run)

    started = threading.Thread(target=training_starts)
    started.start()
    watcher(run, tmp_path, seen).run_forever(interval=0.05, max_polls=1)
    started.join()
    assert [c.path.name for c in seen] == ["ep0-ba2-rank0.pt"]
    assert capsys.readouterr().out.count("waiting for the run folder") == 1


def test_help_names_max_wait_and_its_default(dwb):
    shown = " ".join(dwb("evaluate", "watch", "--help").stdout.split())
    assert "--max-wait SECONDS" in shown and "(default: no limit)" in shown
