"""The layering of DESIGN.md: a package imports only from floors below its own, never against the data flow.

Imports inside functions count too (a lazy import is still a dependency), and so does a relative import
that climbs out of its package.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOORS = {"infra": 1, "ingest": 2, "distill": 3, "learner": 4, "serving": 5, "liveloop": 6}


def imported_packages(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, top-level package) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    own_parts = path.relative_to(root).with_suffix("").parts
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                found.append((node.lineno, node.module.split(".")[0]))
            elif node.level > 0:
                # `from .. import x` inside infra/a/b.py climbs to infra/; above the top it leaves the package.
                base = own_parts[: len(own_parts) - node.level]
                found.append((node.lineno, base[0] if base else "<outside>"))
    return found


def violations(floors: dict[str, int] = FLOORS, root: Path = ROOT) -> list[str]:
    bad = []
    for package, floor in floors.items():
        for path in sorted((root / package).rglob("*.py")):
            for line, top in imported_packages(path, root):
                if top == "<outside>" or (top in floors and floors[top] > floor):
                    bad.append(f"{path.relative_to(root)}:{line} {package} (floor {floor}) imports {top}")
    return bad


def test_no_package_imports_from_a_higher_floor() -> None:
    assert violations() == []


def test_the_check_catches_an_upward_import(tmp_path: Path) -> None:
    (tmp_path / "infra").mkdir()
    (tmp_path / "infra" / "bad.py").write_text("def f():\n    from serving import gateway\n")
    (tmp_path / "ingest").mkdir()
    (tmp_path / "ingest" / "ok.py").write_text("import infra.settings\n")
    found = violations({"infra": 1, "ingest": 2, "serving": 5}, tmp_path)
    assert found == ["infra/bad.py:2 infra (floor 1) imports serving"]
