"""The state the compiler's stages share (:data:`dsv4sel.engine.compile.STAGES`).

A stage reads what the stages before it left here and records every problem
it finds, with its code (:mod:`dsv4sel.engine.codes`), where the offending
text was written; it never stops at the first one.
"""

from __future__ import annotations

from ..errors import ImplLoadError, Problem
from .load import LoadedFile
from .model import InputDecl, Program, Rule, Table, template_fields
from .profile import SELECTOR, Profile
from .suggest import did_you_mean
from .values import RuleRef, check_impl_allowed

#: A default rule waiting for its place: (override, pack rank, load order, rule).
_DefaultEntry = tuple[bool, int, int, Rule]


class Compilation:
    """What the stages share: the files, the profile, the problems found so far,
    and the parts of the program each stage builds for the next."""

    def __init__(self, files: list[LoadedFile], allowed: tuple[str, ...], packs: dict[str, str], profile: Profile):
        self.files = files
        self.profile = profile
        self.allowed = allowed
        self.packs = packs
        self._environment_files: frozenset[str] | None = None
        self.problems: list[Problem] = []
        self.descriptions: dict[RuleRef, str] = {}
        #: (file, line, column) of each declaration by a pack (not the shipped
        #: rules) that grew the space: new input values or backends, load order
        self.growth: list[tuple[str, int, int]] = []
        self.inputs: dict[str, InputDecl] = {}
        self.tables: dict[str, Table] = {}
        self.request_tables: dict[str, Table] = {}
        self.default_table: Table | None = None
        self.backend_order: list[str] = []
        self.declared_in: dict[str, LoadedFile] = {}
        self.rules: list[Rule] = []
        self.seen_ids: dict[str, Rule] = {}
        self.default_entries: list[_DefaultEntry] = []
        self.pack_rank: dict[str, int] = {}
        self.copies: dict[str, LoadedFile] = {}
        self.program: Program | None = None

    def grew(self, f: LoadedFile, path: tuple) -> None:
        if self.packs.get(f.file, "dsv4sel") != "dsv4sel":
            line, column = f.where(path)
            self.growth.append((f.file, line, column))

    def error(self, f: LoadedFile, path: tuple, code: str, message: str, *, key: bool = False) -> None:
        """Record problem ``code`` (:mod:`dsv4sel.engine.codes`) at ``path`` of ``f``."""
        self.problems.append(f.problem(path, code, message, key=key))

    def check_impl(self, f: LoadedFile, path: tuple, impl: str) -> None:
        try:
            check_impl_allowed(impl, self.allowed, from_environment=f.file in self.environment_files())
        except ImplLoadError as exc:
            self.error(f, path, "DSV310", str(exc))

    def environment_files(self) -> frozenset[str]:
        """The files (as messages name them) of the packs ``DSV4SEL_RULES_PATH`` lists: a
        serving process's packs, whose impl modules its environment must allow."""
        if self._environment_files is None:
            from .sources import environment_packs

            self._environment_files = frozenset(s.display for p in environment_packs() for s in p.sources())
        return self._environment_files

    def check_template(self, f: LoadedFile, path: tuple, text: str) -> None:
        try:
            names = template_fields(text)
        except ValueError as exc:
            self.error(f, path, "DSV304", f"bad template: {exc}")
            return
        allowed = set(self.inputs) | {SELECTOR}
        for name in names:
            if name not in allowed:
                self.error(f, path, "DSV304", f"unknown placeholder {{{name}}}; available: "
                           + ", ".join(sorted(allowed)) + did_you_mean(name, allowed))

    def file_of(self, display: str) -> LoadedFile:
        return next(x for x in self.files if x.file == display)

