"""The exit statuses every ``dsv4sel`` command returns, defined once.

0 success; 1 a finding, a rejection or a difference; 2 unusable input (bad
arguments, bad rule files, a path that does not exist); 3 an internal error
(a bug in dsv4sel, reported in one line by :func:`dsv4sel.cli.main`); 130
an interrupt (Ctrl-C: 128 + SIGINT, what a shell shows for a command it
stopped).
"""

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED = 130
