"""The house rules of docs/ARCHITECTURE.md that code can check: the core never looks inside a
family by name. A family is one folder and one registry line; judging, feasibility, thresholds,
records, reports, the plugin and the command line work from what the family declares."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from qual import units
from qual.workloads import registry

QUAL = Path(__file__).resolve().parent.parent / "qual"
CORE = ["judge.py", "feasibility.py", "thresholds.py", "record.py", "measurement.py",
        "report.py", "cli.py", "flags.py", "family.py", "plan.py",
        *(f"plugin/{p.name}" for p in (QUAL / "plugin").glob("*.py")),
        *(f"commands/{p.name}" for p in (QUAL / "commands").glob("*.py"))]


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
    for name in ("cli.py", *(f"commands/{p.name}" for p in (QUAL / "commands").glob("*.py"))):
        # the commands' own returns
        text = (QUAL / name).read_text()
        found += [f"{name}:{text.count(chr(10), 0, m.start()) + 1}"
                  for m in re.finditer(r"\breturn \d+\b", text)]
    assert not found, "an exit status spelled as a number:\n" + "\n".join(found)
    assert bare.search("pytest.exit(said, returncode=4)")


def layers() -> list[set[str]]:
    """docs/ARCHITECTURE.md §1's picture: the qual modules each layer names, top first."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text().split("## 1. The layers", 1)[1]
    picture = text.split("```", 2)[1]
    found = [set(re.findall(r"\b(qual(?:\.\w+)?)\b", line)) for line in picture.splitlines()]
    return [names for names in found if names]


def module_group(name: str) -> str:
    """qual.workloads.gnn.loaders is qual.workloads; qual.plan is itself; `qual` alone (its
    __init__: shipped()) is qual.shipped."""
    parts = name.split(".")
    return "qual.shipped" if parts == ["qual"] else ".".join(parts[:2])


def imports_of(path: Path) -> set[str]:
    """The qual modules a source imports, wherever in it (a function's own imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "qual":
            if node.module == "qual":
                found |= {f"qual.{a.name}" for a in node.names}
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "qual"}
    return found


def test_every_import_goes_down_the_layers_the_house_plan_draws():
    order = layers()
    where = {name: i for i, names in enumerate(order) for name in names}
    assert {"qual.cli", "qual.engine", "qual.measurement", "qual.targets"} <= set(where), where
    unknown, upward = set(), []
    for path in sorted(QUAL.rglob("*.py")):
        mine = module_group("qual." + ".".join(path.relative_to(QUAL).with_suffix("").parts)
                            .removesuffix(".__init__")) if path.name != "__init__.py" or \
            path.parent != QUAL else "qual.shipped"
        for imported in imports_of(path):
            theirs = module_group(imported)
            for name in (mine, theirs):
                if name not in where:
                    unknown.add(name)
            if mine in where and theirs in where and where[theirs] < where[mine]:
                upward.append(f"{path.relative_to(QUAL.parent)}: {imported} (layer "
                              f"{where[theirs]}) from layer {where[mine]}")
    assert not unknown, f"modules the picture does not place: {sorted(unknown)}"
    assert not upward, "imports that go up the layers:\n" + "\n".join(upward)




def module_name(path: Path) -> str:
    """qual/store/__init__.py is qual.store; qual/store/db.py is qual.store.db."""
    parts = path.relative_to(QUAL.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_imports_itself_back_through_others():
    """No circle among qual's modules, a function's own import counted as the module's (one
    that closes a circle is the circle it hides): the guard, identity and the nvme-cli
    wrapper, and the store and its database, each imported back once."""
    known = {module_name(p) for p in QUAL.rglob("*.py")}
    graph = {}
    for path in QUAL.rglob("*.py"):
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            named = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from qual.targets import nvme` imports the module qual.targets.nvme
                named = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                         else node.module for a in node.names]
            elif isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            for imported in named:
                while imported not in known and "." in imported:  # a name from a module
                    imported = imported.rsplit(".", 1)[0]
                if imported in known:
                    edges.add(imported)
        graph[module_name(path)] = edges - {module_name(path)}
    circles, state = [], {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(trail[trail.index(nxt):] + [node, nxt])
                               if nxt in trail else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, trail + [node])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_no_family_names_a_suite_function():
    """A family declares its tests (Family.tests) and plans them by declaration; its code
    never spells a suite function's name, which a renamed test would silently stop
    matching."""
    found = []
    for path in sorted((QUAL / "workloads").rglob("*.py")):
        text = path.read_text()
        found += [f"{path.relative_to(QUAL)}:{text.count(chr(10), 0, m.start()) + 1}: "
                  f"{m.group(0)}" for m in re.finditer(r"""["']test_\w+["']""", text)]
    assert not found, "a family names a suite function:\n" + "\n".join(found)
    declared = {name for name, fam in registry().items() if fam.tests}
    assert declared >= {"bandwidth", "kvcache", "checkpoint", "training", "gnn", "pts",
                        "integrity"}


def test_the_readme_s_table_of_exit_statuses_is_qual_s():
    """One table of exit statuses, the README's, and it is qual.exits' (every code, its
    meaning as the commands' help says it)."""
    from qual.exits import MEANINGS, Exit

    readme = (ROOT / "README.md").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| (.+) \|$", readme, re.M))
    assert rows == {str(int(c)): MEANINGS[c] for c in Exit}
