"""qual: qualification of NVMe SSDs for AI training rigs."""

from pathlib import Path

__all__ = ["shipped"]


def shipped(folder: str) -> Path:
    """A folder qual ships (thresholds, suites): in an installed wheel (qual/data/), or at the
    top of the source tree for an editable install."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "data" / folder, here.parent / folder):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"qual's {folder}/ folder is missing: reinstall qual from its source tree")
