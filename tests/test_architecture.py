"""The code obeys docs/architecture.md: which part may import which, no import circles, no
private names across modules.

Every module of the package (``echo_et/`` and ``converters/``, installed as
``echo_et.converters``) is parsed with ``ast``; every import counts, including those inside
functions (a lazy import is still an arrow).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

from conftest import REPO

# What each part may import besides itself (docs/architecture.md, "Arrows"). The package
# root (``echo_et``: version, EchoError), ``errors`` and the generated ``_proto`` are the floor.
FLOOR = {"echo_et", "errors"}
ALLOWED: dict[str, set[str]] = {
    "_proto": set(),
    "errors": set(),
    "echo_et": {"errors"},
    "ir": FLOOR | {"_proto"},
    "converters": FLOOR | {"ir"},
    "models": FLOOR | {"ir"},
    "passes": FLOOR | {"ir"},
    "sim": FLOOR | {"ir", "models"},
    "trace": FLOOR | {"ir", "converters"},
    "workloads": FLOOR | {"ir", "trace"},
    "experiments": FLOOR | {"ir", "converters", "models", "passes", "sim", "trace", "workloads"},
    "cli": FLOOR | {"ir", "converters", "models", "passes", "sim", "trace", "workloads", "experiments"},
}
# The nevers the design names, checked on their own so that a widened ALLOWED cannot hide one.
NEVER: dict[str, set[str]] = {
    "converters": {"sim", "passes", "models", "experiments", "cli", "trace", "workloads"},
    "sim": {"converters", "passes", "experiments", "cli", "trace", "workloads"},
    "passes": {"sim", "cli", "experiments", "converters", "trace", "workloads"},
    "models": {"converters", "passes", "sim", "experiments", "cli", "trace", "workloads"},
    "experiments": {"cli"},
    "ir": {"converters", "passes", "models", "sim", "trace", "workloads", "experiments", "cli"},
    "trace": {"cli", "experiments", "sim", "passes"},
    "workloads": {"cli", "experiments"},
}
ENTRY_POINT = "echo_et.cli"  # only the CLI's own modules import the CLI


@dataclass(frozen=True)
class Import:
    importer: str     # dotted module name
    target: str       # dotted module name (resolved; a submodule when the name is one)
    names: tuple[str, ...]
    line: int


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "converters":
        parts = ["echo_et", *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _package_files() -> list[Path]:
    files = sorted((REPO / "echo_et").rglob("*.py")) + sorted((REPO / "converters").rglob("*.py"))
    return [f for f in files if "_proto" not in f.relative_to(REPO).parts]


MODULES: dict[str, Path] = {_module_name(f): f for f in _package_files()}


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    out: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(Import(module, a.name, (), node.lineno) for a in node.names if a.name.startswith("echo_et"))
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node)
            if not target.startswith("echo_et"):
                continue
            names = tuple(a.name for a in node.names)
            subs = [n for n in names if f"{target}.{n}" in MODULES]
            for n in subs:  # `from echo_et.ir import io` imports the module echo_et.ir.io
                out.append(Import(module, f"{target}.{n}", (), node.lineno))
            rest = tuple(n for n in names if n not in subs)
            if rest or not subs:
                out.append(Import(module, target, rest, node.lineno))
    return out


ALL_IMPORTS: list[Import] = [i for m, p in MODULES.items() for i in _imports(m, p)]


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_part_is_known() -> None:
    assert {part_of(m) for m in MODULES} <= set(ALLOWED) - {"_proto"}, "a new part: add it to docs/architecture.md"


def test_each_part_imports_only_what_it_may() -> None:
    bad = [f"{i.importer}:{i.line} imports {i.target} ({part_of(i.importer)} may not import {part_of(i.target)})"
           for i in ALL_IMPORTS
           if part_of(i.target) != part_of(i.importer) and part_of(i.target) not in ALLOWED[part_of(i.importer)]]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("part", sorted(NEVER))
def test_the_nevers(part: str) -> None:
    bad = [f"{i.importer}:{i.line} imports {i.target}" for i in ALL_IMPORTS
           if part_of(i.importer) == part and part_of(i.target) in NEVER[part]]
    assert not bad, "\n".join(bad)


def test_nothing_imports_the_cli_but_the_cli() -> None:
    bad = [f"{i.importer}:{i.line} imports {i.target}" for i in ALL_IMPORTS
           if (i.target == ENTRY_POINT or i.target.startswith(ENTRY_POINT + "."))
           and not i.importer.startswith(ENTRY_POINT)]
    assert not bad, "\n".join(bad)


def test_no_import_circle_between_parts() -> None:
    g = nx.DiGraph()
    for i in ALL_IMPORTS:
        a, b = part_of(i.importer), part_of(i.target)
        if a != b:
            g.add_edge(a, b)
    assert not list(nx.simple_cycles(g))


def test_no_import_circle_between_modules() -> None:
    """Imports of a package's ``__init__`` (its re-exports) are left out: ``from echo_et.ir
    import Job`` inside ``echo_et.ir.checker`` names the package, not a circle of modules."""
    g = nx.DiGraph()
    for i in ALL_IMPORTS:
        if i.target in MODULES and MODULES[i.target].name != "__init__.py" and i.target != i.importer:
            g.add_edge(i.importer, i.target)
    cycles = sorted(sorted(c) for c in nx.simple_cycles(g))
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_private_name_imported_across_modules() -> None:
    bad = [f"{i.importer}:{i.line} imports {n} from {i.target}" for i in ALL_IMPORTS
           for n in i.names if _private(n) and i.target != i.importer]
    bad += [f"{i.importer}:{i.line} imports private module {i.target}" for i in ALL_IMPORTS
            if any(_private(p) for p in i.target.split(".")[1:]) and part_of(i.target) != "_proto"
            and not i.importer.startswith(i.target.rsplit(".", 1)[0])]
    assert not bad, "\n".join(bad)


class _PrivateAttributes(ast.NodeVisitor):
    """``x._name`` outside a class body, where ``x`` is not ``self``/``cls``: another
    object's internals (a module's or a result's). Names bound by importing a third-party
    module are not the project's: their internals are that project's business."""

    def __init__(self, module: str, tree: ast.Module) -> None:
        self.module = module
        self.depth = 0
        self.found: list[str] = []
        self.foreign: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                self.foreign |= {(a.asname or a.name).split(".")[0] for a in node.names
                                 if not a.name.startswith("echo_et")}
            elif isinstance(node, ast.ImportFrom) and not node.level and not (node.module or "").startswith("echo_et"):
                self.foreign |= {a.asname or a.name for a in node.names}

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    def visit_Attribute(self, node: ast.Attribute) -> None:
        root = node.value
        while isinstance(root, ast.Attribute):
            root = root.value
        root_name = root.id if isinstance(root, ast.Name) else ""
        if _private(node.attr) and self.depth == 0 and root_name not in ("self", "cls") \
                and root_name not in self.foreign:
            self.found.append(f"{self.module}:{node.lineno} reads .{node.attr}")
        self.generic_visit(node)


def test_no_private_attribute_read_across_objects() -> None:
    bad: list[str] = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        v = _PrivateAttributes(module, tree)
        v.visit(tree)
        bad += v.found
    assert not bad, "\n".join(bad)


def test_the_architecture_page_names_every_part() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    missing = [p for p in ALLOWED if p not in ("_proto", "echo_et", "errors") and f"`{p}`" not in text]
    assert not missing, f"docs/architecture.md does not describe {missing}"


def test_the_walk_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    """A lazy or relative import is still an arrow; the walk must see both."""
    path = tmp_path / "probe.py"
    path.write_text("def f():\n    from echo_et.cli.common import load_job_arg\n"
                    "    from ..sim import simulator\n")
    found = _imports("echo_et.passes.probe", path)
    assert [i.target for i in found] == ["echo_et.cli.common", "echo_et.sim.simulator"]


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")
# Messages in parts that other work owns at the time of writing; each names a flag still.
# Remove an entry when its file is reworded (the test then guards it).
FLAG_DEBT: set[str] = set()


def _error_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """String pieces inside ``raise`` statements and ``*Error(...)`` calls."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        holder = None
        if isinstance(node, ast.Raise) and node.exc is not None:
            holder = node.exc
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name.endswith("Error"):
                holder = node
        if holder is not None:
            out += [(c.lineno, c.value) for c in ast.walk(holder)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return out


def test_library_errors_name_no_flag() -> None:
    """Below the CLI, errors speak of values; the CLI maps an OptionError to its flag."""
    bad = []
    for module, path in MODULES.items():
        if module.startswith(ENTRY_POINT) or module in FLAG_DEBT:
            continue
        for line, text in _error_strings(ast.parse(path.read_text())):
            if FLAG.search(text):
                bad.append(f"{module}:{line}: {text!r}")
    assert not bad, "\n".join(bad)


def test_flag_debt_is_still_debt() -> None:
    """An entry of FLAG_DEBT whose file no longer names a flag must leave the list."""
    for module in FLAG_DEBT:
        texts = [t for _, t in _error_strings(ast.parse(MODULES[module].read_text()))]
        assert any(FLAG.search(t) for t in texts), f"{module} is clean: remove it from FLAG_DEBT"


# -- tests that fail when the code breaks ----------------------------------------------------
def _test_files() -> list[Path]:
    return sorted((REPO / "tests").glob("*.py"))


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def test_no_test_skips_on_the_projects_own_failures() -> None:
    """A skip is for an absent external input (shared data, a binary, an optional package),
    never for the project's own exception or its own module: no ``pytest.skip`` inside an
    ``except`` handler, no ``importorskip`` of an ``echo_et`` module, and every
    ``importorskip`` says why."""
    bad = []
    for path in _test_files():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Call) and _call_name(inner) in ("skip", "xfail"):
                        bad.append(f"{path.name}:{inner.lineno}: skip inside an except handler")
            if isinstance(node, ast.Call) and _call_name(node) == "importorskip":
                arg = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else ""
                if str(arg).startswith("echo_et"):
                    bad.append(f"{path.name}:{node.lineno}: importorskip of the project's own {arg}")
                if not any(k.arg == "reason" for k in node.keywords):
                    bad.append(f"{path.name}:{node.lineno}: importorskip({arg!r}) without a reason")
    assert not bad, "\n".join(bad)
