"""Spellings of a GPU capability, turned into the vocabulary's canonical form.

People write a CUDA compute capability in many ways; each accepted spelling
has one meaning, and anything else is refused (never decided as
``unknown``, which happens only when asked for or when no capability is
given):

====================================  ==========  ==============================
spelling                              canonical   note
====================================  ==========  ==============================
``9.0``, ``10.3``                     itself      major.minor, as torch prints it
``(9, 0)`` (tuple or text)            ``9.0``     ``torch.cuda.get_device_capability()``
``90``, ``100``, ``103``, ``121``     ``9.0`` ... an SM number: the last digit is the minor
``sm90``, ``sm_90``, ``sm_90a``,      ``9.0``     nvcc arch names; a/f suffixes name the
``compute_90``                                    same capability
``9``, ``10``, ``12``                 ``9.0`` ... a major alone (SM 1.x no longer exists,
                                                  so 10-19 are majors, 20-99 SM numbers)
``gfx942``, ``gfx942:sramecc+:xnack-``  ``gfx942``  ROCm arch; torch appends target features
GPU names (``H100``, ``MI300X``)      per data    the vocabulary's ``aliases:``
====================================  ==========  ==============================

A capability string is at most :data:`MAX_LENGTH` printable ASCII
characters: digits of other scripts (``٩.٠``, ``９.０``), NBSP, line
separators, CR, LF and NUL are no spelling, and matching a string against
GPU names stays a bounded cost. A string naming two GPUs (``H100 MI300X``)
is refused, not decided by the first.

This module knows spellings only; which capabilities exist is the
vocabulary's business (see :meth:`dsv4sel.dsv4.rules.RuleSet.normalize`):
:func:`spelled` is the one reading of a spelling (every command and the
doctor's kernel checks go through it), and :func:`platforms_declaring` says
which platforms of a vocabulary declare what it spells, so a GPU name tells
its platform (``MI300X`` is ROCm) when none was given.
"""

from __future__ import annotations

import re

# ASCII only: `\d` would also match the digits of every other script
_DOTTED = re.compile(r"([0-9]{1,2})\.([0-9]{1,2})", re.ASCII)
_TUPLE_TEXT = re.compile(r"\( *([0-9]{1,2}) *, *([0-9]{1,2}) *\)", re.ASCII)
_SM = re.compile(r"(?:sm|compute)_?([0-9]{1,3})[af]?", re.ASCII)
_DIGITS = re.compile(r"[0-9]{1,3}", re.ASCII)
_GFX = re.compile(r"(gfx[0-9a-f]{3,4})(?::[a-z0-9_+\-:]{0,40})?", re.ASCII)

#: The longest capability string looked at (the longest GPU name in use is ~40).
MAX_LENGTH = 64


def acceptable(text: str) -> bool:
    """Whether ``text`` may be a capability spelling at all: at most
    :data:`MAX_LENGTH` characters, each printable ASCII (space to ``~``)."""
    return len(text) <= MAX_LENGTH and all(" " <= c <= "~" for c in text)


def _from_digits(digits: str) -> str:
    """An SM number or a major alone, as ``major.minor``."""
    number = int(digits)
    if len(digits) == 1 or 10 <= number <= 19 and len(digits) == 2:
        return f"{number}.0"
    return f"{number // 10}.{number % 10}"


def canonical(capability: object) -> str | None:
    """The canonical text of ``capability``, or None when it is no known spelling.

    ``capability`` is a string or a ``(major, minor)`` tuple of ints (bools and
    floats are not ints here: ``(9.0, 0)`` is refused, not read as 9.0)."""
    if isinstance(capability, tuple):
        if len(capability) == 2 and all(type(x) is int and 0 <= x < 100 for x in capability):
            return f"{capability[0]}.{capability[1]}"
        return None
    if not isinstance(capability, str) or not acceptable(capability):
        return None
    text = capability.strip(" ").lower()
    if text == "unknown":
        return text
    match = _DOTTED.fullmatch(text) or _TUPLE_TEXT.fullmatch(text)
    if match:
        return f"{int(match.group(1))}.{int(match.group(2))}"
    match = _SM.fullmatch(text) or _DIGITS.fullmatch(text)
    if match:
        return _from_digits(match.group(1) if match.re is _SM else match.group(0))
    match = _GFX.fullmatch(text)
    if match:
        return match.group(1)
    return None


def spelled(capability: object, aliases: dict[tuple[str, ...], str]) -> str | None:
    """The canonical text ``capability`` spells: :func:`canonical`, else the value of the GPU
    name it contains (:func:`match_alias` over ``aliases``, :func:`name_tokens` of each alias
    to its value); None when it is neither."""
    text = canonical(capability)
    if text is None and isinstance(capability, str):
        text = match_alias(capability, aliases)
    return text


def platforms_declaring(text: str, declared: dict[str, tuple[str, ...]]) -> list[str]:
    """The platforms of ``declared`` (platform -> its capability values) that declare the
    canonical capability ``text``; none for ``unknown``, which every platform declares."""
    return [] if text == "unknown" else [p for p, values in declared.items() if text in values]


#: How messages name each platform's hardware ("MI300X is a ROCm GPU").
PLATFORM_NAMES = {"cuda": "CUDA", "rocm": "ROCm", "xpu": "XPU", "cpu": "CPU"}


def name_tokens(name: str) -> tuple[str, ...]:
    """A GPU name as lower-case words, ignoring spaces and punctuation."""
    return tuple(re.findall(r"[a-z0-9]+", name.lower(), re.ASCII))


def match_alias(name: str, aliases: dict[tuple[str, ...], str]) -> str | None:
    """The value of the longest alias whose words appear, in order and
    adjacent, in ``name``: "NVIDIA H100 80GB HBM3" matches ``H100``, and
    "GH200" does not. ``aliases`` maps :func:`name_tokens` of each alias to
    its value. None when ``name`` is no :func:`acceptable` string, or names
    two GPUs: another alias matches words outside the longest match and
    means another value ("H100 MI300X")."""
    if not acceptable(name):
        return None
    found = _occurrences(name_tokens(name), aliases)
    if not found:
        return None
    n, start, value = max(found, key=lambda f: (f[0], -f[1]))
    for m, i, other in found:
        if other != value and (i + m <= start or i >= start + n):
            return None  # two GPUs named at once
    return value


def _occurrences(words: tuple[str, ...], aliases: dict[tuple[str, ...], str]) -> list[tuple[int, int, str]]:
    """Every (length, start, value) at which an alias's words occur in ``words``."""
    found: list[tuple[int, int, str]] = []
    for alias, value in aliases.items():
        n = len(alias)
        found.extend((n, i, value) for i in range(len(words) - n + 1) if n and words[i:i + n] == alias)
    return found


def gpus_named(name: str, aliases: dict[tuple[str, ...], str]) -> list[tuple[tuple[str, ...], str]]:
    """The GPUs ``name`` names, as ``(alias words, value)`` in the order written: the longest
    alias first, then the longest of the words outside it, and so on; one per value. Two
    or more: ``name`` names several GPUs at once ("H100 A100"), which :func:`match_alias`
    refuses; the error path says which (the query's cost is bounded by :func:`acceptable`)."""
    if not acceptable(name):
        return []
    words = name_tokens(name)
    taken: list[tuple[int, int, str]] = []
    for n, i, value in sorted(_occurrences(words, aliases), key=lambda f: (-f[0], f[1])):
        if all(i + n <= j or i >= j + m for m, j, _ in taken) and all(v != value for _, _, v in taken):
            taken.append((n, i, value))
    return [(words[i:i + n], value) for n, i, value in sorted(taken, key=lambda f: f[1])]


#: Spellings shown when a capability is refused.
SPELLINGS = "'9.0', '9', '90', 'sm90', 'sm_90', (9, 0), 'gfx942', a GPU name, or 'unknown'"
