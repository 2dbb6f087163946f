"""The cffi builder: compiles native/src/*.c into the extension qual._native (API mode)."""

import re
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "native" / "include" / "qual.h"
SOURCES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "native" / "src").glob("*.c"))
CFLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-D_GNU_SOURCE", "-pthread"]


CONSTANT = re.compile(r"#define (QUAL_[A-Z_]+)\s+\S")


def cdef_from_header(text: str) -> str:
    """qual.h without its preprocessor lines: the header is the single source of the API. Its
    QUAL_* constants stay, their values taken from the compiled header (`...`)."""
    lines = []
    for line in text.splitlines():
        constant = CONSTANT.match(line.lstrip())
        if constant:
            lines.append(f"#define {constant.group(1)} ...")
        elif not line.lstrip().startswith("#"):
            lines.append(line)
    return "\n".join(lines)


ffibuilder = FFI()
ffibuilder.cdef(cdef_from_header(HEADER.read_text()))
ffibuilder.set_source(
    "qual._native",
    '#include "qual.h"',
    sources=SOURCES,
    include_dirs=[str(HEADER.parent.relative_to(ROOT))],
    extra_compile_args=CFLAGS,
    extra_link_args=["-pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
