"""human_eval: blind pairwise A/B rating in a browser, with confidence intervals and Bradley-Terry rankings.

The flow: `dwb human-eval create` builds a study folder from sample manifests (or image folders plus a
prompt CSV), `dwb human-eval serve` shows its pairs to raters in a browser and stores their votes in
SQLite (or any SQLAlchemy database), `dwb human-eval report` turns the votes into preference rates with
95% intervals, a sign test, per-category breakdowns, Bradley-Terry scores, agreement and gold checks.

This package reads only files: it imports neither `train` nor `evaluate`.
"""
from .errors import HumanEvalError

__all__ = ["HumanEvalError"]
