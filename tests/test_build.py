"""The native engine builds clean with warnings on, and its cffi cdef is its header."""

import shutil
import subprocess

import pytest

from qual import _build


@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")
def test_native_sources_compile_without_warnings(tmp_path):
    for source in _build.SOURCES:
        proc = subprocess.run(["gcc", *_build.CFLAGS, "-Wshadow", "-Werror", "-fsyntax-only",
                               "-I", str(_build.HEADER.parent), str(_build.ROOT / source)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_cdef_is_the_header_with_its_constants_taken_from_the_compiled_header():
    text = _build.HEADER.read_text()
    cdef = _build.cdef_from_header(text)
    kept = [line for line in cdef.split("\n") if line.startswith("#")]
    assert kept == ["#define QUAL_UNBOUNDED ..."]
    assert "int qual_job_run(" in cdef and "struct qual_hist {" in cdef
    assert [line for line in cdef.split("\n") if not line.startswith("#")] == \
        [line for line in text.splitlines() if not line.lstrip().startswith("#")]


def test_unbounded_is_the_largest_bound_not_zero():
    from qual._native import lib

    assert lib.QUAL_UNBOUNDED == 2**64 - 1
