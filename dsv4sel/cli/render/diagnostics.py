"""Machine formats for diagnostics: GitHub workflow annotations and SARIF 2.1.0.

``check`` and ``test`` turn their findings into :class:`Diagnostic` values
(:func:`dsv4sel.cli.render.check.diagnostics`, :func:`dsv4sel.cli.render.test.diagnostics`)
and print them with :func:`github` or :func:`sarif`, so both commands annotate a
pull request the same way. The ``--format`` option itself is :func:`dsv4sel.cli.options.add_format_option`.
"""

from __future__ import annotations

import os

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


class Diagnostic:
    """One finding or failure: a stable ``code``, ``severity`` (error or warning), where, and the text.
    (A plain class: this module is imported by every CLI start, dataclasses costs ~12 ms.)"""

    __slots__ = ("code", "severity", "message", "file", "line", "column")

    def __init__(self, code: str, severity: str, message: str, file: str, line: int, column: int | None = None):
        self.code, self.severity, self.message = code, severity, message
        self.file, self.line, self.column = file, line, column


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github(diagnostics) -> str:
    """``::error file=F,line=L,col=C,title=CODE::message`` per diagnostic
    (workflow commands; ``warning`` for warnings)."""
    from ...engine.codes import title

    out = []
    for d in diagnostics:
        level = "warning" if d.severity == "warning" else "error"
        props = [f"file={_escape_property(d.file)}", f"line={max(d.line, 1)}"]
        if d.column is not None:
            props.append(f"col={d.column}")
        props.append(f"title={_escape_property(d.code + ' ' + title(d.code))}")
        out.append(f"::{level} {','.join(props)}::{_escape_data(d.code + ': ' + d.message)}")
    return "\n".join(out) + ("\n" if out else "")


def _uri(file: str) -> str:
    """``file`` as a SARIF ``uri``: absolute paths as ``file:`` URIs, relative
    ones percent-encoded (RFC 3986: a space, ``#``, ``?``, ``%`` or a control
    character in a file name must not change what the URI names)."""
    if os.path.isabs(file):
        from pathlib import Path

        return Path(file).as_uri()
    from urllib.parse import quote

    return quote(file.replace(os.sep, "/"), safe="/")


def sarif(diagnostics) -> str:
    """A SARIF 2.1.0 log: one run of tool ``dsv4sel``, one result per
    diagnostic with its code as ``ruleId`` and a physical location."""
    import json

    from ..._version import __version__
    from ...engine.codes import CODES, title

    diagnostics = list(diagnostics)
    used = sorted({d.code for d in diagnostics})
    rules = [{"id": code, "name": CODES.get(code, ("", ""))[0] or code,
              "shortDescription": {"text": title(code)}} for code in used]
    index = {code: i for i, code in enumerate(used)}
    results = []
    for d in diagnostics:
        region = {"startLine": max(d.line, 1)}
        if d.column is not None:
            region["startColumn"] = d.column
        results.append({
            "ruleId": d.code,
            "ruleIndex": index[d.code],
            "level": "warning" if d.severity == "warning" else "error",
            "message": {"text": d.message},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(d.file)}, "region": region}}],
        })
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "dsv4sel", "version": __version__, "rules": rules}},
            "results": results,
        }],
    }
    return json.dumps(log, indent=2) + "\n"

