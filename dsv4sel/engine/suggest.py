"""Did-you-mean: the declared words closest to a misspelt one.

The one place every "did you mean ...?" comes from: unknown query values
(:mod:`dsv4sel.engine.ruleset`), unknown names in rule files (:mod:`dsv4sel.engine.compile`,
:mod:`dsv4sel.check.outcomes`, :mod:`dsv4sel.check.verifier`) and unknown schema fields
(:mod:`dsv4sel.engine.validate`). ``difflib`` is imported inside the functions: only
an error pays for it, never the serving path's cold start.
"""

from __future__ import annotations

#: difflib's similarity ratio below which a word is not offered (its own default).
CUTOFF = 0.6


def close_matches(word: object, candidates, n: int = 1) -> list[str]:
    """Up to ``n`` of ``candidates`` (as strings) closest to ``word``, best first."""
    import difflib

    return difflib.get_close_matches(str(word), [str(c) for c in candidates], n=n, cutoff=CUTOFF)


def did_you_mean(word: object, candidates) -> str:
    """``"; did you mean 'X'?"`` for the closest candidate, or ``""`` when none is close."""
    close = close_matches(word, candidates)
    return f"; did you mean {close[0]!r}?" if close else ""
