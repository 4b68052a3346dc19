"""Everything a ``dsv4sel`` command writes, made from the typed values the tools return.

The operator tools (:mod:`dsv4sel.tools`) and the verifier (:mod:`dsv4sel.check`) return
frozen values; a subcommand (``dsv4sel/cli/<command>.py``) parses its arguments, calls
one of them, hands the value to a renderer here and sets the exit status. A renderer is a
function of a value (and, for people, a :class:`~dsv4sel.cli.render.text.Style`), returns
text and decides nothing: it reads no file, asks no machine and parses no argument.

One module per output, one implementation of each:

- :mod:`.text`: the primitives of every text report (colour only on a terminal, the one
  column aligner, wrapping to the terminal's width, how a query's place is spelled);
- :mod:`.data`: the JSON document ``--json`` prints, from a value's ``as_dict()``;
- :mod:`.diagnostics`: GitHub workflow annotations and SARIF 2.1.0 (``--format``);
- :mod:`.explain`, :mod:`.check`, :mod:`.test`, :mod:`.table` (the support matrix, in
  Markdown for ``docs/backends.md``), :mod:`.doctor`, :mod:`.diff`: each command's report.

This package imports nothing at module level, so a command loads only the renderers it
prints with.
"""
