"""docs/testing.md's examples (the pytest plugin), run exactly as they are written there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "testing.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_the_example_test_is_at_most_15_lines_and_sends_twice_with_the_sdk() -> None:
    example = _python_blocks()[0]
    assert len(example.strip().splitlines()) <= 15
    assert example.count("send_messages(") == 2 and "from azure.servicebus import" in example
    assert '["duplicates_dropped"] == 1' in example


def test_the_example_test_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_readme_example=_python_blocks()[0])
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=240)
    result.assert_outcomes(passed=1)


def test_the_example_test_fails_when_the_resend_is_not_a_duplicate(pytester: pytest.Pytester) -> None:
    """The example can fail: the same test without duplicate detection sees the message twice."""
    example = _python_blocks()[0].replace('{"requires_duplicate_detection": True}', "{}")
    pytester.makepyfile(test_readme_example=example)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=240)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*AssertionError*"])


def test_the_serve_example_runs(pytester: pytest.Pytester) -> None:
    script = pytester.makepyfile(serve_example=_python_blocks()[1])
    result = pytester.runpython(script)
    assert result.ret == 0, result.stderr.str()
    assert re.search(r"Endpoint=sb://127\.0\.0\.1:\d+;.* 0$", result.stdout.str().strip())
