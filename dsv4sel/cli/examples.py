"""The examples each subcommand's ``--help`` ends with (one place for all)."""

from __future__ import annotations

import argparse

EXAMPLES: dict[str, str] = {
    "explain": """\
examples:
  dsv4sel explain --platform cuda --capability 9.0                       # the platform default
  dsv4sel explain --platform cuda --capability 10.0 --backend FLASHINFER_MLA_SPARSE_DSV4 --kv-cache-dtype fp8
  dsv4sel explain --platform cuda --capability 10.0 --model deepseek_v4_1 --input mega_attn=available
  dsv4sel explain --detect --json                                        # this machine, as JSON
""",
    "table": """\
examples:
  dsv4sel table                                        # the support matrix as Markdown
  dsv4sel table --format md --check docs/backends.md   # exit 1 when the committed matrix is stale
""",
    "doctor": """\
examples:
  dsv4sel doctor                                       # this machine
  dsv4sel doctor --platform cuda --capability 12.1     # another machine
""",
    "diff": """\
examples:
  dsv4sel diff old-rules/ rules/                       # what an edit of the rules changes
  dsv4sel diff --pack - my-pack/rules --allow-impl-module my_pack   # what a new pack changes
""",
    "upgrade": """\
examples:
  dsv4sel upgrade vllm 0.33 0.34                       # what changes for DeepSeek-V4 with vLLM 0.34
  dsv4sel upgrade vllm 0.33 0.34 --json                # every change, as data
""",
}

TOP = """\
examples:
  dsv4sel explain --platform cuda --capability 9.0   # why this backend and cache format
  dsv4sel check                                      # prove every input is decided exactly once
  dsv4sel test tests/decisions                       # expected decisions, written as data
  dsv4sel COMMAND --help                             # options and examples of one command
"""


def attach(parser: argparse.ArgumentParser, subparsers) -> None:
    """Give the top-level parser and every subcommand without an epilog its examples."""
    parser.epilog = TOP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for name, sub in subparsers.choices.items():
        if name in EXAMPLES and not sub.epilog:
            sub.epilog = EXAMPLES[name]
            sub.formatter_class = argparse.RawDescriptionHelpFormatter
