"""DeepSeek-V4's evaluation: the rule set a query is asked of.

:class:`RuleSet` is the engine's :class:`~dsv4sel.engine.ruleset.CompiledRules`
with what a DeepSeek-V4 query means: :meth:`RuleSet.normalize` turns raw
values (``"sm_90"``, ``"H100"``, an enum backend) into a :class:`Query` of
declared values, :meth:`RuleSet.outcome` turns the compiled row into a
:class:`Selection` or a :class:`Rejection`, and results are memoized per raw
query, so a repeated query is one dict probe. This module imports neither
yaml, jsonschema nor torch.
"""

from __future__ import annotations

from ..engine.artifact import RejectRow
from ..engine.ruleset import CompiledRules
from ..engine.values import Message
from ..errors import InvalidQuery, SelectionError
from .profile import PROFILE
from .selection import NAMED_INPUTS, Query, Selection

#: The longest refused query value matched against the vocabulary and shown whole.
_MAX_SHOWN = 64

_MEMO_LIMIT = 65536

TYPE_CHECKING = False
if TYPE_CHECKING:  # importing typing costs ~5 ms; with postponed annotations it is not needed
    from typing import Any, Mapping

    from ..engine.artifact import GapRow, Row
    from ..engine.values import RuleRef

#: the row of a query outside the decision space (normalize() admits only declared points)
OUTSIDE = RejectRow(("reject", None, "the query is outside the decision space", (), ()))


def _memo_key(platform, kv_cache_dtype, backend, capability, model, extra) -> tuple | None:
    """The memo key of a raw query, or None when it must not be memoized.

    Python calls ``9.0 == 9`` and ``True == 1`` equal, so a memo keyed on raw
    values would answer ``(9.0, 0)`` with what ``(9, 0)`` got. Keys hold
    exact types only: ``str`` and None as given; a tuple capability or an
    enum backend under a tag no raw value can equal (so the hot path in
    :func:`dsv4sel.select`, which probes the memo with raw values, misses
    them and comes here)."""
    if type(platform) is not str or type(kv_cache_dtype) is not str or type(model) is not str:
        return None
    if backend is not None and type(backend) is not str:
        name = getattr(backend, "name", None)
        if type(name) is not str:
            return None
        backend = ("enum", name)
    if capability is not None and type(capability) is not str:
        if type(capability) is not tuple or not all(type(x) is int for x in capability):
            return None
        capability = ("tuple", *capability)
    key: tuple = (platform, kv_cache_dtype, backend, capability, model)
    if not extra:
        return key
    items = sorted(extra.items())  # keyword arguments: the names are str
    for _name, value in items:
        if value.__class__ is not str:
            return None
    return key + tuple(items)


class Rejection:
    """A rejected point: a view of its compiled reject or gap row (``reason``, ``backend``
    and ``gap`` are read from ``row``); :meth:`error` builds a fresh SelectionError to raise."""

    __slots__ = ("ruleset", "query", "row", "rule", "path", "messages", "suggestions")

    def __init__(self, ruleset: RuleSet, query: Query, row: RejectRow | GapRow, path: tuple[RuleRef, ...],
                 messages: tuple[Message, ...] = ()):
        self.ruleset, self.query, self.row, self.path, self.messages = ruleset, query, row, path, messages
        self.rule: RuleRef | None = path[-1] if path else None
        self.suggestions: tuple[str, ...] | None = None

    @property
    def backend(self) -> str | None:
        """The backend whose table rejected (None: the default-backend decision)."""
        return self.row.backend

    @property
    def gap(self) -> bool:
        """True when no rule decides the point (a gap in the rules), not a rule's rejection."""
        return self.row.kind == "gap"

    @property
    def reason(self) -> str:
        row = self.row
        if row.kind == "reject":
            return row.reason
        where = "the default-backend decision" if row.table == "<default>" else f"the table of {row.table}"
        return f"no rule in {where} decides this input (a gap in the rules; `dsv4sel check` lists all gaps)"

    def error(self) -> SelectionError:
        """A fresh exception to raise; the suggestions are computed once per memoized rejection."""
        if self.suggestions is None:
            self.suggestions = self.ruleset.suggestions(self.query)
        return SelectionError(self.message(), suggestions=self.suggestions,
                              rule=self.rule, query=self.query, path=self.path)

    def message(self) -> str:
        q = self.query
        backend = q.backend or (f"{self.backend} (the default there)" if self.backend
                                else "the default backend")
        where = f" [rule {self.rule.id} at {self.rule.location}]" if self.rule else ""
        return (f"{PROFILE.subject}: no selection for {backend} with kv-cache dtype "
                f"{q.kv_cache_dtype!r} on {q.platform} {q.capability} ({q.model}): {self.reason}{where}")


class RuleSet(CompiledRules):
    """Compiled DeepSeek-V4 rules: the decision for every point of the declared space.

    Build one with :func:`dsv4sel.load_rules`. Instances are immutable and safe
    to share between threads (the memo is a plain dict of immutable values).
    """

    def __init__(self, data: dict[str, Any], digest: str, allowed_impl_modules: tuple[str, ...] | None = None):
        super().__init__(data, digest, allowed_impl_modules, PROFILE)
        #: the inputs a :class:`Query` carries in ``extra``, in key order: every input it does not
        #: name (a built-in one of the profile's key, or one a pack declares), each read as given
        #: or at its declared default, nothing else to normalize
        self.plain_inputs: tuple[str, ...] = tuple(n for n in self.key_inputs if n not in NAMED_INPUTS)

    # --------------------------------------------------------- normalization
    def _invalid(self, what: str, value: Any, valid, hint: str = "", flag_of: str | None = None) -> InvalidQuery:
        """``flag_of``: the input whose flag the suggestions spell (else the bare value)."""
        from .alternatives import flag  # the error path only: the cold start loads neither
        from ..engine.suggest import close_matches

        from ..engine.text import escape

        # a long string is refused without matching (close_matches is quadratic) and shown cut short
        long = isinstance(value, str) and len(value) > _MAX_SHOWN
        near = close_matches(value, valid) if isinstance(value, str) and not long else []
        shown = f"{value[:_MAX_SHOWN]!r}... ({len(value):,} characters)" if long else repr(value)
        text = f"unknown {what} {escape(shown)}"
        text += f"; did you mean {near[0]!r}?" if near else "."
        text += f" Valid {what} values: {', '.join(valid)}" + hint
        return InvalidQuery(text, suggestions=tuple(flag(flag_of, n) if flag_of else n for n in near))

    def normalize(self, *, platform: Any, kv_cache_dtype: Any = "auto", backend: Any = None,
                  capability: Any = None, model: Any = "deepseek_v4",
                  extra: Mapping[str, Any] | None = None) -> tuple[Query, tuple[Message, ...]]:
        """Turn raw query values into a :class:`Query` of declared values.

        Raises :class:`InvalidQuery` (a SelectionError) for anything outside the
        vocabulary. Returns the messages normalization produced (e.g. an
        undeclared capability decided as ``unknown``)."""
        notes: list[Message] = []
        models = self.values("model")
        if not isinstance(model, str) or model not in models:
            raise self._invalid("model", model, models)
        platforms = self.values("platform")
        plat = platform.lower() if isinstance(platform, str) else platform
        if plat not in platforms:
            raise self._invalid("platform", platform, platforms)
        cap = self._capability(plat, capability, notes)
        name = self._backend(backend)
        kv = kv_cache_dtype.strip().lower() if isinstance(kv_cache_dtype, str) else kv_cache_dtype
        kvs = self.values("kv_cache_dtype")
        if kv not in kvs:
            raise self._invalid("kv-cache dtype", kv_cache_dtype, kvs, flag_of="kv_cache_dtype")
        point = {"model": model, "platform": plat, "capability": cap, "kv_cache_dtype": kv}
        extras = self._extras(dict(extra or {}), point)
        return Query(model, plat, cap, name, kv, extras), tuple(notes)

    def _backend(self, backend: Any) -> str | None:
        """The declared backend ``backend`` names (a name in any case, or an enum member);
        None for the platform default."""
        if backend is None or backend == "":
            return None
        name = getattr(backend, "name", backend)
        if not isinstance(name, str):
            raise InvalidQuery(f"backend must be None, a name or an enum member, not {type(backend).__name__}")
        name = name.strip().upper()
        if name in self.backends:
            return name
        others = [b for b in self.backends if b not in self.selectable_backends]
        hint = (" (or no backend for the platform default)"
                + (f"; {len(others)} other vLLM backends are known but not DeepSeek-V4 ones "
                   "(`dsv4sel table` lists what each backend serves)" if others else ""))
        from .alternatives import flag
        from ..engine.suggest import close_matches

        near = close_matches(name, self.backends)
        text = f"unknown attention backend {name!r}"
        text += f"; did you mean {near[0]!r}?" if near else "."
        raise InvalidQuery(text + " DeepSeek-V4 backends: " + ", ".join(self.selectable_backends)
                           + hint, suggestions=tuple(flag("backend", n) for n in near))

    def _extras(self, given: dict[str, Any], point: dict[str, Any]) -> tuple[tuple[str, str], ...]:
        """The :attr:`plain_inputs` as ``(name, value)`` pairs: ``given`` or their defaults,
        each checked against the values declared where ``point`` is (``point`` grows with them)."""
        for key in given:
            if key not in self.plain_inputs:
                raise InvalidQuery(f"unknown input {key!r}; the rules declare: "
                                   + ", ".join(PROFILE.builtin_inputs + self.extra_inputs))
        extras = []
        for name_ in self.plain_inputs:
            value = given.get(name_, self.default_of(name_))
            by, _ = self.scope(name_)
            # an input scoped by another (prefill_context_parallel by model) has the values of its parent's value
            valid = self.values(name_) if by is None else self.values(name_, point.get(by))
            if value not in valid and by is not None and value in self.values(name_):
                raise InvalidQuery(f"{name_} {value!r} is not declared for {by} {point.get(by)!r}; "
                                   f"there it is one of: {', '.join(valid)}")
            if value not in valid:
                raise self._invalid(name_, value, valid)
            extras.append((name_, value))
            point[name_] = value
        return tuple(extras)

    def _capability(self, platform: str, capability: Any, notes: list[Message]) -> str:
        """The declared capability value that ``capability`` spells (see
        :mod:`dsv4sel.dsv4.capability`), for ``platform``. None means unknown; any
        other value that is not a known spelling of a declared capability is
        an :class:`InvalidQuery` naming the nearest valid ones."""
        default = self.default_of("capability")
        valid = self.values("capability", platform)
        if capability is None:
            return default if default in valid else valid[-1]
        if capability.__class__ is str and capability in valid:
            return capability  # already canonical: spares the cold start the spelling parser
        from ..engine.text import escape
        from .capability import MAX_LENGTH, SPELLINGS, acceptable, spelled

        if isinstance(capability, str) and not acceptable(capability):
            # refused before any matching: its cost must not grow with the string
            return self._refuse_capability(
                f"capability {escape(repr(capability[:MAX_LENGTH]))}{'...' if len(capability) > MAX_LENGTH else ''} "
                f"({len(capability):,} characters) is not a capability spelling: one is at most {MAX_LENGTH} "
                f"printable ASCII characters. Write it as {SPELLINGS}.", [])
        text = spelled(capability, self.gpu_names())
        if text in valid:
            return text
        if text is not None:  # a valid spelling of a capability this platform does not declare
            return self._undeclared_capability(platform, capability, text, valid, notes)
        return self._unknown_capability(platform, capability, valid)

    def gpu_names(self) -> dict[tuple[str, ...], str]:
        """The vocabulary's GPU names (``aliases:`` of the capability) as
        :func:`~dsv4sel.dsv4.capability.spelled` reads them."""
        from .capability import name_tokens

        return {name_tokens(a): v for a, v in self.aliases("capability")}

    def capability_platform(self, capability: Any) -> str | None:
        """The one platform whose declared capabilities include the one ``capability`` spells
        (``MI300X``, ``gfx942`` -> ``rocm``; ``H100``, ``9.0`` -> ``cuda``); None when it
        spells none, ``unknown``, or one several platforms declare. What a command asks
        when a capability is given without a platform."""
        from .capability import platforms_declaring, spelled

        text = spelled(capability, self.gpu_names())
        if text is None:
            return None
        found = platforms_declaring(text, {p: self.values("capability", p) for p in self.values("platform")})
        return found[0] if len(found) == 1 else None

    def _undeclared_capability(self, platform: str, capability: Any, text: str, valid: tuple[str, ...],
                               notes: list[Message]) -> str:
        """The fallback for capability ``text``, which ``platform`` does not declare (with a
        warning in ``notes``), or an :class:`InvalidQuery` when the rules give none. A
        capability another platform declares (a ROCm GPU asked about on cuda) is refused
        naming that platform, whatever the fallback: it is a wrong platform, not an
        unknown capability of this one."""
        self._refuse_other_platform(platform, capability, text)
        _, fallback = self.scope("capability")
        if fallback is not None and fallback in valid:
            notes.append(Message(f"capability {text!r} is not declared for {platform} in the rule "
                                 f"vocabulary; deciding as {fallback!r}", "warning"))
            return fallback
        return self._refuse_capability(
            f"{platform} capability {text!r}"
            + (f" (given as {capability!r})" if capability != text else "")
            + " is not declared in the rule "
            f"vocabulary. Declared {platform} capabilities: {', '.join(valid)}. Pass capability 'unknown' to "
            f"decide without it, or declare it in a rule pack", [v for v in valid if v == "unknown"])

    def _refuse_other_platform(self, platform: str, capability: Any, text: str) -> None:
        """Refuse capability ``text`` (spelled ``capability``) when exactly one other platform
        declares it: "MI300X is a ROCm GPU (gfx942): use --platform rocm". Else return."""
        from .capability import PLATFORM_NAMES, canonical, platforms_declaring

        others = platforms_declaring(text, {p: self.values("capability", p)
                                            for p in self.values("platform") if p != platform})
        if len(others) != 1:
            return
        other = others[0]
        name = PLATFORM_NAMES.get(other, other)
        if canonical(capability) is None:  # a GPU name
            what = f"{capability} is a {name} GPU ({text})"
        else:
            what = f"{capability!r} is a {name} capability" + (f" ({text})" if capability != text else "")
        raise InvalidQuery(f"{what}: use --platform {other}", suggestions=(f"--platform {other}",))

    def _unknown_capability(self, platform: str, capability: Any, valid: tuple[str, ...]) -> str:
        """The :class:`InvalidQuery` for a value that spells no capability, naming the nearest."""
        from ..engine.suggest import close_matches
        from ..engine.text import escape
        from .capability import SPELLINGS, canonical

        self._refuse_two_gpus(capability, valid)
        names = [a for a, v in self.aliases("capability") if v in valid]
        by_lower = {c.lower(): c for c in (*valid, *names)}
        near = [by_lower[n] for n in close_matches(str(capability).strip().lower(), by_lower, n=3)]
        parenthesized = canonical(f"({capability})") if isinstance(capability, str) and "," in capability else None
        if parenthesized is not None and parenthesized in valid:
            near.insert(0, parenthesized)  # "9,0": the parentheses or the dot were meant
        hint = f"; did you mean {' or '.join(repr(n) for n in dict.fromkeys(near))}?" if near else "."
        return self._refuse_capability(
            f"{escape(repr(capability))} is not a {platform} capability{hint} Write it as {SPELLINGS}. "
            f"Declared {platform} capabilities: {', '.join(valid)}", list(dict.fromkeys(near)))

    def _refuse_two_gpus(self, capability: Any, valid: tuple[str, ...]) -> None:
        """Refuse ``capability`` when it is a string naming several GPUs ("H100 A100"): which,
        and to give one. Else return (the caller refuses it as no capability)."""
        from .capability import gpus_named, name_tokens

        if not isinstance(capability, str):
            return
        pairs = list(self.aliases("capability"))
        spelled = {name_tokens(a): a for a, _ in pairs}
        named = gpus_named(capability, {name_tokens(a): v for a, v in pairs})
        if len(named) < 2:
            return
        shown = [f"{spelled[words]} ({value})" for words, value in named]
        self._refuse_capability(
            f"capability {capability!r} names {len(named)} GPUs at once, {', '.join(shown[:-1])} and {shown[-1]}: "
            "give one, the GPU this process runs on", [spelled[w] for w, v in named if v in valid])

    @staticmethod
    def _refuse_capability(message: str, near: list[str]):
        from .alternatives import flag

        raise InvalidQuery(message, suggestions=tuple(flag("capability", n) for n in near))

    # ------------------------------------------------------------ evaluation
    def decides(self, name: str, point: Mapping[str, Any]) -> bool:
        """Whether input ``name`` changes an outcome where the inputs of ``point`` (declared
        values, by name) hold: two of its values give different outcomes at some values of
        the inputs ``point`` leaves free (the backend's include None, the platform default).
        With every other input in ``point`` this is "does it decide this query?" (explain's
        query line shows only those); with the platform and capability alone, "does it decide
        anything on this machine?" (the doctor asks an input's probe only then)."""
        from itertools import product

        names = self.key_inputs
        free = [i for i, n in enumerate(names) if n != name and n not in point]
        choices = [(None, *self.backends) if names[i] == "backend" else self.values(names[i]) for i in free]
        key = [point.get(n) for n in names]
        at, values, lookup = names.index(name), self.values(name), self.index
        for combo in product(*choices):
            for i, value in zip(free, combo):
                key[i] = value
            seen = None
            for value in values:
                key[at] = value
                index = lookup(tuple(key))
                if index is None:  # a value not declared here (a scoped input)
                    continue
                if seen is None:
                    seen = index
                elif index != seen and self.rows[index] != self.rows[seen]:
                    return True
        return False

    def key(self, query: Query, **changes: str | None) -> tuple:
        """The lookup key of a normalized query, with the inputs named in ``changes``
        (built-in or pack-declared) set to other values: the one place a key is
        built, in :attr:`key_inputs` order (the profile's key, then the packs' inputs)."""
        point = query.point()
        if changes:
            point.update(changes)
        return tuple(point[name] for name in self.key_inputs)

    def outcome(self, query: Query, notes: tuple[Message, ...] = ()) -> Selection | Rejection:
        """The decision for a normalized query (a Selection, or a Rejection to raise): the one
        place a compiled row becomes a result, which reads every field from the row."""
        index = self.index(self.key(query))
        row: Row = self.rows[index] if index is not None else OUTSIDE  # normalize() admits declared points only
        path = tuple(self.rule(i) for i in row.path)
        messages = notes + tuple(Message(text, level) for level, text in row.messages)
        if row.kind == "select":
            return Selection(row, query, path[-1], path, messages, self.allowed_impl_modules)
        return Rejection(self, query, row, path, messages)

    def select(self, platform, kv_cache_dtype="auto", backend=None, capability=None,
               model="deepseek_v4", extra=None) -> Selection:
        """Like :func:`dsv4sel.select` on this rule set."""
        memo_key = _memo_key(platform, kv_cache_dtype, backend, capability, model, extra)
        hit = self.memo.get(memo_key) if memo_key is not None else None
        if hit is None:
            query, notes = self.normalize(platform=platform, kv_cache_dtype=kv_cache_dtype, backend=backend,
                                          capability=capability, model=model, extra=extra)
            hit = self.outcome(query, notes)
            if memo_key is not None:
                if len(self.memo) >= _MEMO_LIMIT:
                    self.memo.clear()
                self.memo[memo_key] = hit
        if isinstance(hit, Rejection):
            raise hit.error()
        return hit

    # ----------------------------------------------------------- alternatives
    def alternatives(self, query: Query, limit: int = 4) -> tuple:
        """The nearest changes of (backend, kv dtype) that select, as
        :class:`dsv4sel.dsv4.alternatives.Alternative` values, smallest change
        first (the order and why: :mod:`dsv4sel.dsv4.alternatives`)."""
        from .alternatives import nearest  # only rejections pay for it

        return nearest(self, query, limit)

    def suggestions(self, query: Query) -> tuple[str, ...]:
        """Engine flags for :meth:`alternatives`, e.g. ``--kv-cache-dtype fp8``."""
        return tuple(alt.suggestion for alt in self.alternatives(query))
