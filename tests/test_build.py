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


def test_cdef_is_the_header_without_preprocessor_lines():
    text = _build.HEADER.read_text()
    cdef = _build.cdef_from_header(text)
    assert "#" not in cdef
    assert "int qual_job_run(" in cdef and "struct qual_hist {" in cdef
    assert cdef == "\n".join(line for line in text.splitlines()
                              if not line.lstrip().startswith("#"))
