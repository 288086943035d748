"""Text from outside, escaped for where it is written: a spreadsheet cell.

(HTML goes through the standard library's ``html.escape`` at each page's writer; Markdown model cards through
``models.checkpoints``' own writer.)
"""
from __future__ import annotations

# What a spreadsheet runs as a formula when a cell starts with it (OWASP, "CSV Injection"): a prompt or a model
# label of "=HYPERLINK(...)" in votes.csv or results.csv ran as one in whoever opened the file.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_cell(value):
    """``value`` as a CSV cell no spreadsheet runs: text that starts like a formula (``FORMULA_STARTS``) gets a
    leading ``'``, which spreadsheets take as "text follows"; numbers are left as they are."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_STARTS) else value
