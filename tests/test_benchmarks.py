"""The benchmarks work: each runs once (pytest-benchmark's --benchmark-disable), small, on a
folder of the test machine's disk. Their speed is not asserted here (tests assert behaviour)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.skipif(not shutil.which("fio"), reason="fio is every benchmark's peer")
@pytest.mark.slow
def test_every_benchmark_runs_once_in_smoke_mode(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(BENCHMARKS), "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
         "--benchmark-disable", f"--bench-target={tmp_path / 'bench'}", "--bench-size=16M",
         "--bench-rounds=1"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "10 passed" in proc.stdout
    assert not [p for p in (tmp_path / "bench").iterdir() if p.suffix == ".bin"]  # cleaned up
    left = {p.name for p in tmp_path.iterdir()} - {".benchmarks"}  # pytest-benchmark's store
    assert left == {"bench"}  # nothing else left in the working directory (fio's state files)
