"""A static audit of every SQL query in the packages: the query text must never be built from data.

:func:`audit` parses (``ast``) every ``.py`` file of the packages and looks at two things:

- every call of ``execute``, ``executemany``, ``copy`` or ``stream`` (on a connection or a cursor,
  sync or async): its query argument must be *safe*;
- every ``psycopg.sql.SQL(...)``: its text must be a safe string, because ``sql.SQL`` trusts it as is.

Safe means, recursively: a string literal (implicit concatenation included) or ``literal + literal``;
a ``psycopg.sql`` composition (``sql.SQL(<safe string>)``, ``sql.Identifier``, ``sql.Literal``,
``sql.Placeholder``, ``sql.Composed``, and ``.format(...)``/``.join(...)``/``+``/``*`` of those: psycopg
quotes whatever it puts into such a composition); a name whose every binding in its function (or
else the module) is safe, including a loop variable over a list, tuple or comprehension of safe
values; ``a if c else b`` of safe values. Everything else is a violation: an f-string, ``%`` or
``.format`` on a ``str``, ``+`` with a non-literal, a parameter, the result of an unknown call.

The few places that must run text that is not in the source (the migration files) are listed in
:data:`ALLOWED` with the reason; nothing else is exempt.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

PACKAGES = ("infra", "ingest", "distill", "learner", "serving", "liveloop")
QUERY_METHODS = frozenset({"execute", "executemany", "copy", "stream"})
NOT_DATABASE = frozenset({"shutil", "copy", "os", "subprocess"})
"""Receivers whose ``copy``/``execute`` has nothing to do with SQL (``shutil.copy(src, dst)``)."""
SQL_MODULE = "psycopg.sql"
SAFE_SQL_CLASSES = frozenset({"Identifier", "Literal", "Placeholder", "Composed", "DEFAULT", "NULL"})

ALLOWED: dict[tuple[str, str], str] = {
    ("infra/migrations.py", 'm.sql.encode("utf-8")'): (
        "runs a migration file of infra/migrations/ (package data, checksummed and recorded in schema_migrations); "
        "no request data can reach it"
    ),
}
"""(file, source of the query argument) -> why this non-literal query is fine."""


class Kind(Enum):
    """What an expression is, as far as building a query goes."""

    STR = "a string literal"
    SQL = "a psycopg.sql composition"
    SAFE = "a literal or a psycopg.sql composition"
    UNSAFE = "built at run time"


@dataclass(frozen=True)
class Violation:
    """A query built from something that is not a literal or a psycopg.sql composition."""

    path: str
    line: int
    call: str
    argument: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.call}({self.argument}) is not a literal or a psycopg.sql composition"


@dataclass(frozen=True)
class QuerySite:
    """One query call found (safe or allowed): where, and how its query is built."""

    path: str
    line: int
    call: str
    kind: Kind
    allowed_because: str | None = None


def _combine(kinds: Iterable[Kind]) -> Kind:
    found = set(kinds)
    if not found or Kind.UNSAFE in found:
        return Kind.UNSAFE
    return found.pop() if len(found) == 1 else Kind.SAFE


_OPAQUE = ast.Constant(value=None)  # marks a binding whose value is unknown (a parameter, an import, ...)


class _Scopes(ast.NodeVisitor):
    """Every binding of every name, per scope (module, class, function, lambda)."""

    def __init__(self) -> None:
        self.bindings: dict[ast.AST, dict[str, list[tuple[str, ast.expr]]]] = {}
        self.parent_scope: dict[ast.AST, ast.AST | None] = {}
        self.scope_of: dict[ast.AST, ast.AST] = {}
        self._stack: list[ast.AST] = []

    def _bind(self, name: str, how: str, value: ast.expr) -> None:
        self.bindings[self._stack[-1]].setdefault(name, []).append((how, value))

    def _bind_target(self, target: ast.expr, how: str, value: ast.expr) -> None:
        if isinstance(target, ast.Name):
            self._bind(target.id, how, value)
        elif isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:  # unpacking: the element's value is not tracked
                self._bind_target(element, "opaque", _OPAQUE)
        elif isinstance(target, ast.Starred):
            self._bind_target(target.value, "opaque", _OPAQUE)

    def _enter(self, node: ast.AST) -> None:
        self.parent_scope[node] = self._stack[-1] if self._stack else None
        self.bindings[node] = {}
        self._stack.append(node)

    def generic_visit(self, node: ast.AST) -> None:
        if self._stack:
            self.scope_of[node] = self._stack[-1]
        scoped = isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and self._stack:
            self._bind(node.name, "opaque", _OPAQUE)
        if scoped:
            self._enter(node)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                arguments = node.args
                for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                    self._bind(arg.arg, "opaque", _OPAQUE)
                for extra in (arguments.vararg, arguments.kwarg):
                    if extra is not None:
                        self._bind(extra.arg, "opaque", _OPAQUE)
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._bind_target(target, "value", node.value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self._bind_target(node.target, "value", node.value)
        elif isinstance(node, ast.AugAssign | ast.NamedExpr):
            self._bind_target(node.target, "opaque", _OPAQUE)
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            self._bind_target(node.target, "element", node.iter)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            self._bind_target(node.optional_vars, "opaque", _OPAQUE)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            self._bind(node.name, "opaque", _OPAQUE)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                self._bind((alias.asname or alias.name).split(".")[0], "opaque", _OPAQUE)
        super().generic_visit(node)
        if scoped:
            self._stack.pop()


class _Module:
    """One parsed file: its scopes and what its imported names stand for."""

    def __init__(self, path: str, source: str, repo: Path | None = None) -> None:
        self.path = path
        self.source = source
        self.repo = repo
        self.tree = ast.parse(source, filename=path)
        self.scopes = _Scopes()
        self.scopes.visit(self.tree)
        self.imports: dict[str, str] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    # ``import psycopg.sql`` binds ``psycopg``; ``import psycopg.sql as s`` binds ``s``.
                    bound = alias.asname or alias.name.split(".")[0]
                    self.imports[bound] = alias.name if alias.asname else bound
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def qualified(self, node: ast.expr) -> str | None:
        """``sql.SQL`` -> ``psycopg.sql.SQL`` through the imports; None for anything but a dotted name."""
        if isinstance(node, ast.Name):
            return self.imports.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.qualified(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def text(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.source, node) or ast.dump(node)

    # -- classification ------------------------------------------------------------------------

    def kind(self, node: ast.expr, seen: frozenset[str] = frozenset()) -> Kind:
        """What ``node`` is: a literal, a psycopg.sql composition, or built at run time."""
        if isinstance(node, ast.Constant):
            return Kind.STR if isinstance(node.value, str | bytes) else Kind.UNSAFE
        if isinstance(node, ast.BinOp):
            left, right = self.kind(node.left, seen), self.kind(node.right, seen)
            if isinstance(node.op, ast.Add) and left == right and left in (Kind.STR, Kind.SQL):
                return left
            if isinstance(node.op, ast.Mult) and left == Kind.SQL:  # sql.Placeholder() * n
                return Kind.SQL
            return Kind.UNSAFE  # % on a str, + with a non-literal, ...
        if isinstance(node, ast.IfExp):
            return _combine([self.kind(node.body, seen), self.kind(node.orelse, seen)])
        if isinstance(node, ast.Call):
            return self._call_kind(node, seen)
        if isinstance(node, ast.Name):
            return self._name_kind(node, seen)
        if isinstance(node, ast.JoinedStr):  # an f-string of literals only (constants joined at import) is one too
            values = [v for v in node.values if isinstance(v, ast.FormattedValue)]
            plain = all(v.conversion == -1 and v.format_spec is None for v in values)
            return Kind.STR if plain and all(self.kind(v.value, seen) == Kind.STR for v in values) else Kind.UNSAFE
        return Kind.UNSAFE  # other f-strings, subscripts, attributes, ...

    def _call_kind(self, node: ast.Call, seen: frozenset[str]) -> Kind:
        name = self.qualified(node.func) or ""
        if name == f"{SQL_MODULE}.SQL":
            return Kind.SQL if node.args and self.kind(node.args[0], seen) == Kind.STR else Kind.UNSAFE
        if name.startswith(f"{SQL_MODULE}.") and name.rsplit(".", 1)[1] in SAFE_SQL_CLASSES:
            return Kind.SQL
        if isinstance(node.func, ast.Attribute):
            receiver = self.kind(node.func.value, seen)
            if node.func.attr in ("format", "join") and receiver == Kind.SQL:
                return Kind.SQL  # psycopg quotes what it composes; str.format and str.join are not safe
            if node.func.attr == "encode" and receiver == Kind.STR:
                return Kind.STR
        return Kind.UNSAFE

    def _name_kind(self, node: ast.Name, seen: frozenset[str]) -> Kind:
        if node.id in seen:
            return Kind.UNSAFE
        imported = self._imported_constant(node.id)
        if imported is not None:
            return imported
        scope: ast.AST | None = self.scopes.scope_of.get(node)
        while scope is not None:
            bindings = self.scopes.bindings[scope].get(node.id)
            if bindings:
                return _combine(self._binding_kind(how, value, seen | {node.id}) for how, value in bindings)
            scope = self.scopes.parent_scope[scope]
        return Kind.UNSAFE  # a builtin or an undefined name

    def _imported_constant(self, name: str) -> Kind | None:
        """The kind of a name imported from another module of the audited packages (a query constant shared between
        modules), by that module's own top-level binding; None for any other name."""
        qualified = self.imports.get(name)
        if self.repo is None or qualified is None or qualified.split(".")[0] not in PACKAGES:
            return None
        module_path, _, attribute = qualified.rpartition(".")
        file = self.repo / (module_path.replace(".", "/") + ".py")
        if not file.is_file():
            return None
        other = _Module(file.relative_to(self.repo).as_posix(), file.read_text(encoding="utf-8"), self.repo)
        bindings = other.scopes.bindings[other.tree].get(attribute)
        if not bindings:
            return Kind.UNSAFE
        return _combine(other._binding_kind(how, value, frozenset({attribute})) for how, value in bindings)

    def _binding_kind(self, how: str, value: ast.expr, seen: frozenset[str]) -> Kind:
        if how == "value":
            return self.kind(value, seen)
        if how == "element":
            return self._element_kind(value, seen)
        return Kind.UNSAFE

    def _element_kind(self, iterable: ast.expr, seen: frozenset[str]) -> Kind:
        """The kind of the elements of ``iterable`` (a loop's or a comprehension's)."""
        if isinstance(iterable, ast.List | ast.Tuple | ast.Set):
            return _combine(self.kind(element, seen) for element in iterable.elts)
        if isinstance(iterable, ast.ListComp | ast.GeneratorExp | ast.SetComp):
            return self.kind(iterable.elt, seen)
        if isinstance(iterable, ast.Name):
            scope: ast.AST | None = self.scopes.scope_of.get(iterable)
            while scope is not None:
                bindings = self.scopes.bindings[scope].get(iterable.id)
                if bindings:
                    kinds = [self._element_kind(v, seen) if h == "value" else Kind.UNSAFE for h, v in bindings]
                    return _combine(kinds)
                scope = self.scopes.parent_scope[scope]
        return Kind.UNSAFE

    # -- the sites -----------------------------------------------------------------------------

    def sites(self) -> Iterator[tuple[QuerySite, Violation | None]]:
        """Every query call and ``sql.SQL(...)`` of the file, each with its violation (None when safe)."""
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Call):
                continue
            query = self._query_argument(node)
            if query is None:
                continue
            call = self.text(node.func)
            kind = self.kind(query)
            if self._is_sql_factory(node) and kind != Kind.STR:
                kind = Kind.UNSAFE  # sql.SQL trusts its text: only a literal may go in
            argument = self.text(query)
            allowed = ALLOWED.get((self.path, argument))
            site = QuerySite(self.path, node.lineno, call, kind, allowed)
            violation = None if kind != Kind.UNSAFE or allowed else Violation(self.path, node.lineno, call, argument)
            yield site, violation

    def _is_sql_factory(self, node: ast.Call) -> bool:
        return self.qualified(node.func) == f"{SQL_MODULE}.SQL"

    def _query_argument(self, node: ast.Call) -> ast.expr | None:
        if self._is_sql_factory(node):
            return node.args[0] if node.args else None
        func = node.func
        if not isinstance(func, ast.Attribute) or func.attr not in QUERY_METHODS:
            return None
        if isinstance(func.value, ast.Name) and self.imports.get(func.value.id, func.value.id) in NOT_DATABASE:
            return None
        if node.args:
            return node.args[0]
        return next((k.value for k in node.keywords if k.arg in ("query", "statement")), None)


def package_files(repo: Path, packages: Iterable[str] = PACKAGES) -> list[Path]:
    """Every ``.py`` file of ``packages`` under ``repo``."""
    return sorted(p for package in packages for p in (repo / package).rglob("*.py"))


def audit(repo: Path, packages: Iterable[str] = PACKAGES) -> tuple[list[QuerySite], list[Violation]]:
    """Every query site of the packages and the violations among them."""
    sites: list[QuerySite] = []
    violations: list[Violation] = []
    for path in package_files(repo, packages):
        module = _Module(path.relative_to(repo).as_posix(), path.read_text(encoding="utf-8"), repo)
        for site, violation in module.sites():
            sites.append(site)
            if violation is not None:
                violations.append(violation)
    return sites, violations


def audit_source(source: str, path: str = "example.py") -> list[Violation]:
    """The violations of one piece of source (the audit's own tests use it)."""
    return [v for _, v in _Module(path, source).sites() if v is not None]
