"""The house rules of docs/ARCHITECTURE.md that code can check: the core never looks inside a
family by name. A family is one folder and one registry line; judging, feasibility, thresholds,
records, reports, the plugin and the command line work from what the family declares."""

from __future__ import annotations

import re
from pathlib import Path

from qual import units
from qual.workloads import registry

QUAL = Path(__file__).resolve().parent.parent / "qual"
CORE = ["judge.py", "feasibility.py", "thresholds.py", "record.py", "report.py", "cli.py",
        "command.py", "flags.py", "family.py", "plan.py",
        *(f"plugin/{p.name}" for p in (QUAL / "plugin").glob("*.py"))]


def family_words() -> set[str]:
    """Every registered family's name, subcommand and metric names; a word that is also a unit
    dimension ("bandwidth" is both a family and what B/s measures) is the unit system's."""
    words = set()
    for family in registry().values():
        words |= {family.name, family.subcommand, *family.metrics}
    return words - set(units.DIMENSIONS)


def test_no_core_module_names_a_family_or_its_metrics():
    words = family_words()
    found = []
    for name in CORE:
        text = (QUAL / name).read_text()
        for word in sorted(words):
            for m in re.finditer(rf"""["']{re.escape(word)}["']""", text):
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"qual/{name}:{line}: {word}")
    assert not found, "the core names a family:\n" + "\n".join(found)


def family_imports(text: str) -> list[str]:
    """The family modules a source imports (qual.workloads.<folder>, or from qual.workloads)."""
    folders = {p.name for p in (QUAL / "workloads").iterdir() if (p / "__init__.py").exists()}
    found = re.findall(r"qual\.workloads\.(\w+)", text)
    for names in re.findall(r"from qual\.workloads import ([\w, ]+)", text):
        found += [n.strip() for n in names.split(",")]
    return sorted(set(found) & folders)


def test_no_core_module_imports_a_family():
    """The plugin watched drive health by importing the health family; a watcher is now a hook
    of the family (Family.watch), so no core module imports one."""
    found = [f"qual/{name}: {', '.join(family_imports((QUAL / name).read_text()))}"
             for name in CORE if family_imports((QUAL / name).read_text())]
    assert not found, "the core imports a family:\n" + "\n".join(found)
    assert family_imports("from qual.workloads import health") == ["health"]
    assert family_imports("import qual.workloads.checkpoint.ranks") == ["checkpoint"]


def test_the_check_sees_a_family_name_where_one_is_written():
    """The rule above can fail: a quoted metric name is what it looks for."""
    words = family_words()
    assert "train_au" in words and "seq_read_bw" in words and "checkpoint" in words
    assert re.search(r"""["']train_au["']""", 'if c.metric == "train_au":')


ROOT = QUAL.parent
CITED = ("qual", "suites", "thresholds", "native", "tests", "benchmarks", "scripts", "docs")
OUTSIDE = re.compile(r"reference/[\w-]+\.md|DOMAIN(?:\.md)? ?§|\bDESIGN\.md §")


def sources_keys() -> set[str]:
    """The keys of docs/ARCHITECTURE.md §9's table (its first column)."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text().split("## 9. Sources", 1)[1]
    return {row.split("|")[1].strip() for row in text.splitlines()
            if row.startswith("| ") and not row.startswith("| key")}


def test_the_code_cites_only_the_repository_and_only_sources_that_are_there():
    """No comment, string or profile cites a file outside the repository (the project's
    notes are not shipped); each `docs/ARCHITECTURE.md §9, KEY` names a key §9 holds."""
    keys = sources_keys()
    assert {"DLIO", "seed 004", "SNIA PTS", "MLPerf Storage v3.0"} <= keys, keys
    outside, unknown = [], []
    for folder in CITED:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".toml", ".c", ".h", ".md", ".mjs") or \
                    path.name == "test_architecture.py":
                continue
            text = path.read_text(errors="replace")
            where = path.relative_to(ROOT)
            outside += [f"{where}: {m.group(0)}" for m in OUTSIDE.finditer(text)]
            unknown += [f"{where}: {k}" for k in re.findall(r"ARCHITECTURE\.md §9, ([\w .]+?)[):]",
                                                             " ".join(text.split()))
                        if k not in keys]
    assert not outside, "cites a file outside the repository:\n" + "\n".join(outside)
    assert not unknown, "cites a source §9 does not hold:\n" + "\n".join(unknown)


def test_exit_statuses_are_decided_by_name_from_one_table():
    """qual.exits holds every status qual ends with; no module spells one as a number (the
    command line's returns included), so the help's table is the whole truth."""
    bare = re.compile(r"(?:returncode=|exit_now\(|sys\.exit\(|exitstatus = )\s*\d")
    found = [f"{p.relative_to(QUAL)}:{text.count(chr(10), 0, m.start()) + 1}"
             for p in sorted(QUAL.rglob("*.py")) for text in [p.read_text()]
             for m in bare.finditer(text)]
    cli = (QUAL / "cli.py").read_text()
    found += [f"cli.py:{cli.count(chr(10), 0, m.start()) + 1}"
              for m in re.finditer(r"\breturn \d+\b", cli)]
    assert not found, "an exit status spelled as a number:\n" + "\n".join(found)
    assert bare.search("pytest.exit(said, returncode=4)")
