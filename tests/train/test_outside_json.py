"""The one reader of JSON from outside: size and nesting bounded before any caller walks the value."""
import time

import pytest

from models.common import load_outside, loads_outside
from models.errors import WorkbenchError


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, '{"a":' * 5000 + "1" + "}" * 5000,
                                  "[" * 65 + "]" * 65])
def test_json_nested_past_the_limit_is_one_line(text):
    """5,000 levels raised RecursionError in Python's parser; 65 pass it but are still past the limit."""
    with pytest.raises(WorkbenchError, match=r"^caption\.json: JSON nested deeper than 64 levels$"):
        loads_outside(text, "caption.json")


def test_json_at_the_limit_and_ordinary_files_read():
    assert loads_outside("[" * 64 + "]" * 64, "x") == eval("[" * 63 + "[]" + "]" * 63)
    assert loads_outside(b'{"caption": "a red circle", "n": [1, 2.5]}', "x") == {"caption": "a red circle",
                                                                                  "n": [1, 2.5]}


def test_too_large_invalid_and_not_utf8_are_one_line(tmp_path):
    with pytest.raises(WorkbenchError, match=r"^r\.json: 21 bytes of JSON, over the limit of 20$"):
        loads_outside('{"a": "0123456789ab"}', "r.json", max_bytes=20)
    with pytest.raises(WorkbenchError, match=r"^r\.json: not valid JSON \("):
        loads_outside('{"a": ', "r.json")
    with pytest.raises(WorkbenchError, match=r"^r\.json: not UTF-8 text$"):
        loads_outside(b'{"a": "\xff"}', "r.json")
    big = tmp_path / "big.json"
    big.write_text("[" + "1," * 1000 + "1]")
    with pytest.raises(WorkbenchError, match=r"^big\.json: 2,003 bytes of JSON, over the limit of 100$"):
        load_outside(big, max_bytes=100)  # refused from its size, before it is read


def test_an_open_string_of_escaped_quotes_is_refused_in_linear_time():
    """A pattern scan for strings went quadratic on this; the parser refuses it in one pass."""
    started = time.perf_counter()
    with pytest.raises(WorkbenchError, match="not valid JSON"):
        loads_outside('"' + '\\"' * 2_000_000, "x")
    assert time.perf_counter() - started < 2
