"""The benchmarks' test bed: where they run (a RAM-backed stand-in for a Gen5 drive, or the
folder --bench-target names) and how long (--bench-size, --bench-rounds).

The stand-in is a loop device over a file in /dev/shm with ext4 on it: there the host software,
not the flash, is the limit, as it is on a Gen5 drive moving 14 GB/s. It needs root (losetup,
mount); without root a benchmark runs only on a given --bench-target.

    pytest benchmarks                                   # on the stand-in, 5 rounds
    pytest benchmarks --bench-target /mnt/nvme0/bench   # on a drive
    pytest benchmarks --benchmark-disable --bench-size 16M --bench-rounds 1   # smoke: once
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from qual.units import parse_size
from standin import SHM, ram_stand_in


def pytest_addoption(parser):
    g = parser.getgroup("qual benchmarks")
    g.addoption("--bench-target", default=None,
                help="a folder on the drive to benchmark (default: a RAM-backed loop device)")
    g.addoption("--bench-size", default="1G", help="bytes each tool moves per round")
    g.addoption("--bench-rounds", type=int, default=5,
                help="alternating rounds of qual and its peer (medians are reported)")


@pytest.fixture(scope="session")
def bench_size(request) -> int:
    return parse_size(request.config.getoption("bench_size"))


@pytest.fixture(scope="session")
def bench_rounds(request) -> int:
    return max(1, request.config.getoption("bench_rounds"))


@pytest.fixture(scope="session")
def ram_drive(bench_size):
    """A folder on ext4 on a loop device over a file in /dev/shm, removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("the RAM-backed stand-in needs root (losetup, mount); "
                    "give --bench-target to run on a folder")
    need = 3 * bench_size + (256 << 20)  # qual's and the peer's files, ext4's own
    free = shutil.disk_usage(SHM).free
    if free < need + (512 << 20):
        pytest.skip(f"/dev/shm has {free >> 20} MiB free, the stand-in needs {need >> 20} MiB")
    with ram_stand_in(need) as (point, _):
        yield point


@pytest.fixture(scope="session")
def bench_folder(request, tmp_path_factory):
    """Where the benchmarks run: --bench-target, else the RAM-backed stand-in."""
    if not shutil.which("fio"):
        pytest.skip("fio is not installed (Debian: apt-get install fio): it is every "
                    "benchmark's peer")
    given = request.config.getoption("bench_target")
    if given:
        folder = Path(given)
        folder.mkdir(parents=True, exist_ok=True)
        yield folder
    else:
        yield request.getfixturevalue("ram_drive")
