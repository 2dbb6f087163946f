"""The test bed: real files with known data, loop devices, and suite runs in a subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qual import engine, shipped

HERE = Path(__file__).resolve().parent
TINY_PROFILE = HERE / "profiles" / "tiny.toml"
TINY_ALL = HERE / "profiles" / "tiny-all.toml"
IS_ROOT = os.geteuid() == 0


def write_pattern_file(path: Path, size: int, seed: int) -> None:
    """A file holding the engine's verification pattern for `seed`, written by Python."""
    chunk = 1 << 20
    buf = bytearray(chunk)
    with open(path, "wb") as f:
        for offset in range(0, size, chunk):
            n = min(chunk, size - offset)
            view = memoryview(buf)[:n]
            engine.pattern_fill(view, seed, offset)
            f.write(view)
        f.flush()
        os.fsync(f.fileno())


def sha256_of(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


needs_root = pytest.mark.skipif(not IS_ROOT or not shutil.which("losetup"),
                                reason="loop devices need root and losetup")


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def run_suite(tmp_path: Path, *args: str, profile: Path | str = TINY_PROFILE,
              suite: str = "test_bandwidth.py", alluredir: bool = True,
              env_extra: dict | None = None,
              timeout: int = 300) -> tuple[subprocess.CompletedProcess, Path]:
    """Run a shipped suite (all of them with suite="") in a fresh pytest process from
    tmp_path; returns the process and the results folder (qual-run.json, allure-results/)."""
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "pytest", str(shipped("suites") / suite), "-p", "no:cacheprovider",
           "-p", "no:benchmark", f"--qual-profile={profile}", f"--qual-results={results}",
           "-o", "console_output_style=classic", *args]
    if alluredir:
        cmd.append(f"--alluredir={results / 'allure-results'}")
    env = {**os.environ, **(env_extra or {})}
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                          env=env)
    return proc, results


def load_record(results: Path) -> dict:
    return json.loads((results / "qual-run.json").read_text())
