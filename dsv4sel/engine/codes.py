"""Stable codes for every problem and finding (``DSV301``...), as linters have.

A code names one kind of problem and never changes meaning; scripts, CI
annotations (``dsv4sel check --format github|sarif``) and tests match on codes,
not on message text. Families:

* ``DSV1xx`` reading a file (YAML), ``DSV2xx`` the schema,
* ``DSV3xx`` compiling (vocabulary, references, impl allow-list),
* ``DSV4xx`` verifying the decision space (gaps, overlaps, ...),
* ``DSV5xx`` rule test files and test cases (``dsv4sel test``),
* ``DSV6xx`` host translations, ``DSV7xx`` deployment files (``dsv4sel fleet``).

Each stage sets the code where it finds the problem (``Problem.code``); the
verifier's findings take theirs from their kind (:func:`kind_code`).
``tests/engine/test_codes.py`` holds each code to a real problem.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # the serving path never imports this module; the checker reads the Literal
    from typing import Literal

    #: Every kind of problem and finding: the type checker holds :data:`CODES`, ``Finding.kind``
    #: and every comparison of a kind (mypy's ``strict_equality``) to these.
    Kind = Literal["load", "schema", "vocabulary", "compile", "impl", "dangling", "cycle", "gap", "overlap",
                   "redundant", "shadowed", "dead", "layout", "consistency", "fixpoint", "model", "host",
                   "hostless", "hijack", "takeover", "host-layer", "translation", "host-gap", "host-dead", "tests", "deployment"]

#: code -> (kind, title). Kinds are the verifier's finding kinds.
CODES: dict[str, tuple[Kind, str]] = {
    "DSV101": ("load", "a rule file cannot be read"),
    "DSV102": ("load", "YAML syntax error"),
    "DSV103": ("load", "empty file"),
    "DSV104": ("load", "YAML tag not allowed (rule files are plain data)"),
    "DSV105": ("load", "YAML merge key (<<) not supported"),
    "DSV106": ("load", "duplicate mapping key"),
    "DSV107": ("load", "malformed key or scalar (a bad integer, a leading zero, a non-scalar key)"),
    "DSV108": ("load", "the file exceeds a bound (alias expansion, nesting depth, a recursive alias)"),
    "DSV109": ("load", "a control character in a name or text"),
    "DSV110": ("load", "the rule files of one load exceed a bound of the whole (files, bytes, YAML nodes)"),
    "DSV201": ("schema", "does not match the schema"),
    "DSV202": ("schema", "unquoted YAML number or boolean where a string belongs"),
    "DSV203": ("schema", "unknown field"),
    "DSV204": ("schema", "required field missing"),
    "DSV301": ("vocabulary", "value not declared in the vocabulary"),
    "DSV302": ("vocabulary", "input not declared in the vocabulary"),
    "DSV303": ("vocabulary", "family matches no declared value"),
    "DSV304": ("vocabulary", "bad template or unknown placeholder"),
    "DSV305": ("vocabulary", "conflicting or incomplete input declaration"),
    "DSV306": ("compile", "a required file kind is missing (vocabulary, default decision)"),
    "DSV307": ("compile", "rule id used twice"),
    "DSV308": ("compile", "backend already has a table"),
    "DSV309": ("compile", "malformed rule outcome"),
    "DSV310": ("impl", "impl class outside the allowed modules"),
    "DSV311": ("dangling", "`use:` names a backend without a table"),
    "DSV312": ("cycle", "`use:` chain loops"),
    "DSV313": ("compile", "a rule file loaded twice (the same pack installed and named with --rules)"),
    "DSV314": ("compile", "the decision space is larger than the compiled form holds"),
    "DSV315": ("compile", "a `hosts:` entry (a serving engine's own class) is malformed"),
    "DSV316": ("compile", "the compiled form exceeds a bound (distinct outcomes, rendered text)"),
    "DSV399": ("compile", "other compile problem"),
    "DSV401": ("gap", "inputs no rule decides"),
    "DSV402": ("overlap", "rules overlap under hit policy unique"),
    "DSV403": ("redundant", "rules with identical outcomes overlap"),
    "DSV404": ("shadowed", "rule never decides an input"),
    "DSV405": ("dead", "rule matches no input"),
    "DSV406": ("impl", "impl class does not resolve"),
    "DSV407": ("layout", "layout id not defined"),
    "DSV408": ("consistency", "selection disagrees with its layout or impl"),
    "DSV409": ("fixpoint", "rewrite is not a fixpoint"),
    "DSV410": ("model", "a backend table never tests `model` though several models are declared"),
    "DSV411": ("host", "a host class does not resolve where its host is installed in a listed version"),
    "DSV412": ("hostless", "a backend selects where a host's plugin serves but names no class for that host (`hosts:`)"),
    "DSV413": ("hijack", "a default rule sends inputs to a table that rejects every one of them"),
    "DSV414": ("takeover", "a pack's default rule turns inputs an earlier pack's default served into rejections"),
    "DSV415": ("host-layer", "a rule served by dsv4sel's pack layer does not fit the host's layer that serves its impl"),
    "DSV601": ("translation", "a host translation names an input or value its space does not declare"),
    "DSV602": ("host-gap", "inputs of a host's space that its translation maps to no decision"),
    "DSV603": ("host-dead", "a host translation row decides no input of its host space"),
    "DSV701": ("deployment", "a deployment side names an engine release without a compat rule set"),
    "DSV702": ("deployment", "a deployment side's input or value is not one its rule set declares"),
    "DSV703": ("deployment", "a deployment side's `env` names a variable that does not decide for its engine"),
    "DSV501": ("tests", "a test file where a rule file belongs, or the other way round"),
    "DSV502": ("tests", "no test files at a path"),
    "DSV510": ("tests", "test case failed"),
}

#: The kinds of the stages that set their codes themselves (a kind of many codes).
_STAGE_KINDS = ("load", "schema", "vocabulary", "compile", "tests")

#: verifier finding kind -> its code, read off :data:`CODES` (the one table of codes and
#: kinds): a kind's last code, so ``impl`` is the verifier's DSV406, not the compiler's DSV310
_KIND_CODES = {kind: code for code, (kind, _) in CODES.items() if kind not in _STAGE_KINDS}


def kind_code(kind: Kind) -> str:
    """The code of a verifier finding of ``kind`` (one kind, one code)."""
    return _KIND_CODES.get(kind, "DSV399")


def title(code: str) -> str:
    return CODES.get(code, ("", code))[1]
