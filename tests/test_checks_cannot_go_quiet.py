"""A check that needs what a machine lacks (Chromium and Playwright for the browser tests, the authors' reference
packages for the preference-score equality tests) skips with its reason on a developer's machine, so `make
test-fast` runs on a fresh clone, and fails with that reason under CI=true, where a skipped check would pass in
silence."""
import importlib.util

import pytest

from .conftest import require_chromium


def test_a_missing_browser_skips_here_and_fails_under_ci(tmp_path, monkeypatch):
    missing = tmp_path / "no-chromium"
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="chromium is not installed at"):
        require_chromium(missing)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="chromium is not installed at .*CI=true"):
        require_chromium(missing)


def test_missing_playwright_fails_under_ci(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "playwright" else real(name, *a))
    monkeypatch.setenv("CI", "true")
    present = tmp_path / "chromium"
    present.touch()
    with pytest.raises(pytest.fail.Exception, match="Playwright's Python package is not installed"):
        require_chromium(present)


@pytest.mark.parametrize("package", ["hpsv2", "ImageReward"])
def test_a_missing_reference_package_skips_here_and_fails_under_ci(package, tmp_path, monkeypatch):
    from .evaluate.preference_fixtures import hpsv2_package, image_reward_package

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))
    load = (lambda: hpsv2_package(tmp_path)) if package == "hpsv2" else image_reward_package
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="reference package is not installed"):
        load()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="reference package is not installed.*CI=true"):
        load()
