"""The one prompt-table reader: DrawBench's CSV and PartiPrompts' TSV, shipped with the workbench and read by name,
whatever the file's suffix, and errors that name the file only as the caller shows it (the app never shows a server
path)."""
import hashlib
import re
import shutil

import pytest

from models.errors import WorkbenchError
from models.generation.prompts import prompt_set_path, read_prompt_table

PROMPTS = prompt_set_path("drawbench").parent


@pytest.mark.parametrize("name, file, n, categories", [("drawbench", "drawbench.csv", 200, 11),
                                                       ("parti", "parti_prompts.tsv", 1632, 12)])
def test_shipped_sets_are_the_published_ones_and_read_by_name(name, file, n, categories):
    """The bytes its provenance (SOURCES.md) records, and the published counts."""
    sources = (PROMPTS / "SOURCES.md").read_text()
    section = sources[sources.index(f"## {file}"):]
    recorded = re.search(r"sha256[^`]*`([0-9a-f]{64})`", section)[1]
    assert hashlib.sha256((PROMPTS / file).read_bytes()).hexdigest() == recorded
    table = read_prompt_table(name)
    assert len(table) == n and len({p.category for p in table}) == categories
    assert table == read_prompt_table(PROMPTS / file)


@pytest.mark.parametrize("name", ["drawbench.csv", "parti_prompts.tsv"])
def test_tables_read_the_same_under_any_suffix(name, tmp_path):
    """A browser upload keeps no trustworthy suffix: the header line tells CSV from TSV."""
    table = read_prompt_table(PROMPTS / name)
    renamed = shutil.copy(PROMPTS / name, tmp_path / "upload.txt")
    assert read_prompt_table(renamed) == table
    with open(PROMPTS / name, encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines()[1:] if line.strip()]
    assert len(table) == len(lines) and [p.index for p in table] == list(range(len(table)))
    assert len({p.category for p in table}) > 5 and "uncategorised" not in {p.category for p in table}
    assert read_prompt_table(renamed, limit=7) == table[:7]


@pytest.mark.parametrize("content", ["", "prompt,category\n", "text_missing,category\nfoo,bar\n",
                                     "prompt,category\n,Colors\n", b"\xff\xfe\x00bad"])
def test_errors_name_the_file_as_shown(content, tmp_path):
    path = tmp_path / "secret-server-folder" / "prompts.csv"
    path.parent.mkdir()
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(WorkbenchError) as e:
        read_prompt_table(path, shown_as="upload")
    assert "upload" in str(e.value) and "secret-server-folder" not in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(WorkbenchError, match="secret-server-folder"):
        read_prompt_table(path)  # the command line names the path
