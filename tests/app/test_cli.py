"""`dwb app`'s command line: flags it takes, and one-line errors for the ones it refuses."""


def test_missing_checkpoint_folder_is_one_line_and_nonzero(tmp_path, dwb):
    r = dwb("app", "--checkpoints", str(tmp_path / "nope"), "--port", "1")
    assert r.returncode == 1
    assert r.stderr.strip() == f"error: checkpoint folder not found: {tmp_path / 'nope'} (give existing folders to --checkpoints)"


def test_bad_limits_are_refused(tmp_path, dwb):
    r = dwb("app", "--checkpoints", str(tmp_path), "--max-size", "1020")
    assert r.returncode == 1 and r.stderr.strip() == "error: --max-size must be a multiple of 8, got 1020"
    r = dwb("app", "--checkpoints", str(tmp_path), "--queue-size", "0")
    assert r.returncode == 2 and "--queue-size: must be at least 1, got 0" in r.stderr
    r = dwb("app", "--checkpoints", str(tmp_path), "--max-pixel-steps", "lots")
    assert r.returncode == 2 and "--max-pixel-steps: expected a number such as 250M, got 'lots'" in r.stderr
    r = dwb("app", "--checkpoints", str(tmp_path), "--trusted-proxy", "proxy.local")
    assert r.returncode == 2 and "--trusted-proxy: expected an IP address or network, got 'proxy.local'" in r.stderr


def test_help_lists_the_serving_options(dwb):
    r = dwb("app", "--help")
    assert r.returncode == 0
    for flag in ("--checkpoints", "--host", "--port", "--cache-size", "--concurrency", "--queue-size", "--max-steps",
                 "--max-size", "--max-batch", "--dtype", "--device", "--output", "--max-pixel-steps",
                 "--max-client-requests", "--max-client-pixel-steps", "--trusted-proxy"):
        assert flag in r.stdout
    assert "127.0.0.1" in r.stdout


def test_help_says_each_default_once(dwb):
    """Help strings that said their default got argparse's too (--checkpoints: "(default: the current folder)
    (default: None)")."""
    import re

    text = " ".join(dwb("app", "--help").stdout.split())
    options = re.split(r" (?=--[a-z-]+ )", text.split(" options: ", 1)[1])
    for option in options:
        assert option.count("(default") <= 1 and "(default: None)" not in option and "(default: False)" not in option, \
            option
    assert "(default: the current folder)" in text and "--port PORT port to serve on (default: 7860)" in text
