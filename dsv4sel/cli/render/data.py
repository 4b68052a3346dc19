"""The JSON document of a ``--json`` or ``--format json`` output.

A value's JSON-ready data is its own ``as_dict()`` (``to_dict()`` for the verifier's and
the test runner's reports; for ``diff``, :func:`dsv4sel.cli.render.diff.as_dict`, whose
layout carries the outcomes' text); this is the one spelling of it as text: two-space
indents, keys in the value's order, one final newline.
"""

from __future__ import annotations


def document(data) -> str:
    """``data`` as the JSON text every command prints."""
    import json  # only --json pays for it

    return json.dumps(data, indent=2) + "\n"
