"""The registry of workload families: qual's own (one line each below), plus any family
folder named in the QUAL_FAMILIES environment variable (paths separated by os.pathsep), so a
lab's own family runs through the suites, the CLI, the run record and the report unchanged."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from qual.errors import QualError

EXTRA = "QUAL_FAMILIES"
BUILTIN = (
    "qual.workloads.bandwidth",
    "qual.workloads.pts",
    "qual.workloads.checkpoint",
    "qual.workloads.gnn",
    "qual.workloads.training",
    "qual.workloads.integrity",
    "qual.workloads.powercut",
    "qual.workloads.kvcache",
    "qual.workloads.vectordb",
    "qual.workloads.health",
)

_loaded: dict[str, dict] = {}


def registry() -> dict:
    """name -> Family of every registered family, qual's own first."""
    extra = os.environ.get(EXTRA, "")
    if extra not in _loaded:
        modules = [importlib.import_module(m) for m in BUILTIN]
        modules += [_load_folder(Path(p)) for p in extra.split(os.pathsep) if p.strip()]
        families = {}
        for module in modules:
            family = getattr(module, "FAMILY", None)
            if family is None:
                raise QualError(22, f"{module.__name__} defines no FAMILY")
            if family.name in families:
                raise QualError(22, f"two workload families are named {family.name!r}")
            families[family.name] = family
        _loaded[extra] = families
    return _loaded[extra]


def _load_folder(folder: Path):
    """A family folder (a package with its own __init__.py) given by path in QUAL_FAMILIES."""
    init = folder / "__init__.py"
    if not init.is_file():
        raise QualError(2, f"{EXTRA}: {folder} is not a family folder (no __init__.py)")
    name = f"qual_family_{folder.resolve().name}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, init,
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
