"""The tests' own turns under pytest-xdist (tests/conftest.py): a test marked `solo` runs with
no other test beside it on any worker, and the others still run side by side."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from testbed import HERE

TESTS = textwrap.dedent('''
    import os, time
    import pytest

    def _note(name):
        with open(os.environ["NOTES"], "a") as f:
            f.write(f"{name} {time.monotonic()} start\\n")
        time.sleep(0.6)
        with open(os.environ["NOTES"], "a") as f:
            f.write(f"{name} {time.monotonic()} end\\n")

    @pytest.mark.parametrize("n", range(8))
    def test_shared(n):
        _note(f"shared{n}")

    @pytest.mark.solo
    def test_alone():
        _note("solo")
''')


@pytest.mark.slow
def test_a_solo_test_runs_alone_and_the_others_side_by_side(tmp_path):
    (tmp_path / "test_turns_demo.py").write_text(TESTS)
    notes = tmp_path / "notes"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "3", "-p", "conftest", "-p",
         "no:cacheprovider", "-p", "no:hypothesispytest", "-o", "markers=solo: alone", str(tmp_path / "test_turns_demo.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(HERE), "NOTES": str(notes)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    spans: dict[str, list[float]] = {}
    for line in notes.read_text().splitlines():
        name, at, _ = line.split()
        spans.setdefault(name, []).append(float(at))
    assert len(spans) == 9
    start, end = spans.pop("solo")
    beside = [n for n, (s, e) in spans.items() if s < end and e > start]
    assert not beside, f"{beside} ran beside the solo test"
    overlapping = sum(1 for a, (s1, e1) in spans.items() for b, (s2, e2) in spans.items()
                      if a < b and s1 < e2 and s2 < e1)
    assert overlapping > 0, "the other tests never ran side by side"
