"""The zip directory and pickle of a checkpoint, read by the door's own reader, are what ``zipfile`` reads; any
layout it does not know (or a damaged file) is left to ``zipfile``, which fails as it always did."""
from __future__ import annotations

import zipfile

import pytest

from models.readers import ziphead
from models.checkpoints.composer import read_summary
from models.checkpoints.hashing import file_hash


def _both(path):
    size = path.stat().st_size
    return ziphead._read_fast(str(path), size), ziphead._read_zipfile(str(path))


def test_a_composer_checkpoint_reads_the_same_as_through_zipfile(tiny_run):
    path = tiny_run / "ep0-ba4-rank0.pt"
    fast, slow = _both(path)
    assert fast is not None and fast == slow  # read by the fast path, not handed on
    assert len(fast.members) > 100 and fast.pickle[:2] == b"\x80\x02"  # a protocol-2 pickle, as torch writes


def test_zip64_end_records_read_the_same(tmp_path):
    """More than 65,535 members: the end record overflows and the zip64 record gives the directory."""
    path = tmp_path / "many.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        for i in range(65_600):
            z.writestr(f"archive/data/{i}", b"")
    fast, slow = _both(path)
    assert fast is not None and fast == slow and len(fast.members) == 65_601


@pytest.mark.parametrize("damage", ["truncate", "directory", "pickle"])
def test_damaged_files_fail_as_zipfile_fails(tiny_run, tmp_path, damage):
    data = bytearray((tiny_run / "ep0-ba2-rank0.pt").read_bytes())
    directory = data.rfind(b"PK\x01\x02")
    if damage == "truncate":
        data = data[:directory + 10]
    elif damage == "directory":
        data[directory:directory + 4] = b"XXXX"
    else:  # a byte inside the pickle (past its local header's padding): its CRC no longer matches
        data[data.find(b"data.pkl") + 1000] ^= 0xFF
    path = tmp_path / f"{damage}.pt"
    path.write_bytes(bytes(data))
    if damage == "pickle":
        with pytest.raises(zipfile.BadZipFile, match="CRC"):
            ziphead.zip_head(path)
        return
    try:
        expected = ziphead._read_zipfile(str(path))
    except Exception as e:  # noqa: BLE001 - whatever zipfile raises, the door raises the same
        with pytest.raises(type(e)):
            ziphead.zip_head(path)
    else:
        assert ziphead.zip_head(path) == expected
    with pytest.raises(Exception, match="corrupt|not a PyTorch|not a Composer"):
        read_summary(path)
    assert file_hash(path)  # not a zip any more: named by its sampled bytes, as any other file
