"""Stable codes for every problem and finding (``DSV301``...), as linters have.

A code names one kind of problem and never changes meaning; scripts, CI
annotations (``dsv4sel check --format github|sarif``) and tests match on codes,
not on message text. Families:

* ``DSV1xx`` reading a file (YAML), ``DSV2xx`` the schema,
* ``DSV3xx`` compiling (vocabulary, references, impl allow-list),
* ``DSV4xx`` verifying the decision space (gaps, overlaps, ...),
* ``DSV5xx`` rule test files and test cases (``dsv4sel test``).

The compiler reports problems as text; :func:`problem_code` classifies a
message by the phrases the stages use, so every Problem has a code without
the stages carrying one. ``tests/test_codes.py`` holds each code to a real
problem, so a reworded message that loses its code fails there.
"""

from __future__ import annotations

#: code -> (kind, title). Kinds are the verifier's finding kinds.
CODES: dict[str, tuple[str, str]] = {
    "DSV101": ("load", "a rule file cannot be read"),
    "DSV102": ("load", "YAML syntax error"),
    "DSV103": ("load", "empty file"),
    "DSV104": ("load", "YAML tag not allowed (rule files are plain data)"),
    "DSV105": ("load", "YAML merge key (<<) not supported"),
    "DSV106": ("load", "duplicate mapping key"),
    "DSV107": ("load", "malformed key or scalar"),
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
    "DSV501": ("tests", "a test file where a rule file belongs, or the other way round"),
    "DSV502": ("tests", "no test files at a path"),
    "DSV510": ("tests", "test case failed"),
}

#: verifier finding kind -> its code, where one kind is one code
_KIND_CODES = {
    "gap": "DSV401", "overlap": "DSV402", "redundant": "DSV403", "shadowed": "DSV404", "dead": "DSV405",
    "layout": "DSV407", "consistency": "DSV408", "fixpoint": "DSV409", "cycle": "DSV312",
    "dangling": "DSV311", "model": "DSV410",
}

#: (code, phrases): the first entry with a phrase in the message gives the code
_PHRASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("DSV101", ("cannot read rule file", "cannot read test file", "no such file or directory")),
    ("DSV102", ("YAML syntax error", "YAML error")),
    ("DSV103", ("the file is empty",)),
    ("DSV104", ("is not allowed: rule files are plain YAML data",)),
    ("DSV105", ("merge keys (<<)",)),
    ("DSV106", ("duplicate key",)),
    ("DSV107", ("mapping keys must be plain scalars", "bad scalar")),
    ("DSV202", ("YAML reads the unquoted", "YAML reads unquoted")),
    ("DSV203", ("unknown field",)),
    ("DSV204", ("is a required property",)),
    ("DSV501", ("not a test file", "a `kind: tests` file among the rule files")),
    ("DSV502", ("no test files",)),
    ("DSV310", ("outside the allowed modules",)),
    ("DSV311", ("names a backend without a table",)),
    ("DSV312", ("chain loops", "loops back")),
    ("DSV313", ("is a copy of",)),
    ("DSV301", ("is not a declared value of", "is not a value of", "is not one of the values of")),
    ("DSV302", ("unknown input",)),
    ("DSV303", ("matches no declared value",)),
    ("DSV304", ("unknown placeholder", "bad template")),
    ("DSV305", ("is scoped by", "must map each", "lists values per", "in another file", "needs a `default:`",
                "must be declared after", "the vocabulary does not declare the input",
                "is not declared in the vocabulary")),
    ("DSV306", ("no `kind: default` file", "no `kind: vocabulary` file")),
    ("DSV307", ("is already used at",)),
    ("DSV308", ("already has a table",)),
    ("DSV309", ("needs exactly one of select, use, reject", "a reject rule has no messages",
                "only picks a backend", "select is missing", "`override` applies", "rules do not test `backend`",
                "the default decision's hit policy")),
)


def problem_code(message: str, kind: str | None = None) -> str:
    """The code of a problem or finding with this ``message`` (and verifier ``kind``)."""
    if kind in _KIND_CODES:
        return _KIND_CODES[kind]
    for code, phrases in _PHRASES:
        if any(p in message for p in phrases):
            return code
    if kind == "impl":
        return "DSV406"
    if kind == "schema" or message.startswith("$"):
        return "DSV201"
    if kind == "load":
        return "DSV102"
    return "DSV399"


def title(code: str) -> str:
    return CODES.get(code, ("", code))[1]
