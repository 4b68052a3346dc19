"""Hostile rule packs against the compiled form's bounds, and files a command
is named (issue 17, points 1, 2 and 5): each gives one located error, the
same from ``select()`` and from ``check``, within 2 s."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import dsv4sel
from dsv4sel.engine.sources import default_packs

from _bounds import CpuTimer
from _cli import run

# These packs are generated at test time, so their rules stay a Python template: a message
# aliased 3,000 times and vocabularies of 40 or 246 values. One backend (its head, a YAML file)
# whose rule repeats ``{messages}``, with ``backends:`` on line 4 and its first rule on line 14,
# where the errors are expected.
BACKEND = (Path(__file__).with_name("rules") / "amp_head.yaml").read_text() + """\
  - id: amplified
    when: {{platform: cuda}}
    select: {{}}
    messages: [{messages}]
  - id: amp-rest
    reject:
      reason: no.
"""


def vocabulary(n: int) -> str:
    return ("kind: vocabulary\ninputs:\n  shard:\n    description: many values\n    default: s0\n"
            f"    values: [{', '.join(f's{i}' for i in range(n))}]\n")


def pack(tmp_path, files: dict[str, str]) -> str:
    directory = tmp_path / "amp"
    directory.mkdir()
    for name, text in files.items():
        (directory / name).write_text(text)
    return str(directory)


def refusal(paths) -> tuple[dsv4sel.Problem, float]:
    """The one problem ``load_rules`` refuses ``paths`` with, and the CPU seconds it took."""
    with CpuTimer() as timer, pytest.raises(dsv4sel.RuleError) as info:
        dsv4sel.load_rules(paths, use_cache=False)
    (problem,) = info.value.problems
    return problem, timer.seconds


def test_a_message_aliased_thousands_of_times_is_one_error_at_its_rule_and_check_agrees(tmp_path):
    # 12 kB of YAML: one 300-byte message, aliased 3,000 times, rendered per shard and kv dtype
    text = "x" * 280 + " {shard} {kv_cache_dtype}"
    first = f'&m {{info: "{text}"}}'
    directory = pack(tmp_path, {"shard.vocabulary.yaml": vocabulary(40),
                                "amp.yaml": BACKEND.format(messages=", ".join([first] + ["*m"] * 2999))})
    paths = [*default_packs(), directory]
    problem, seconds = refusal(paths)
    assert problem.code == "DSV316" and seconds < 2
    assert problem.file.endswith("amp/amp.yaml") and problem.line == 14, str(problem)
    # DSV316's wording, pinned here once (tests/engine/wording.yaml's `elsewhere:`)
    assert problem.message == (
        "the distinct outcomes hold more than 4,194,304 bytes of rendered text (messages, reasons, fields): "
        "the compiled form holds at most that, and every start would read it. Shorten the messages (an alias "
        "repeated in a message list repeats its text), or name fewer inputs in {placeholders}: each input "
        "named splits the rule's outcome once per value")
    report = dsv4sel.verify(paths)
    assert [(f.code, f.file, f.line) for f in report.findings] == [("DSV316", problem.file, 14)]


def test_a_pack_that_grows_the_space_past_the_compiled_form_is_refused_at_its_file_by_check_too(tmp_path):
    directory = pack(tmp_path, {"shard.vocabulary.yaml": vocabulary(246),
                                "amp.yaml": BACKEND.format(messages="{info: hi}")})
    paths = [*default_packs(), directory]
    problem, seconds = refusal(paths)
    assert problem.code == "DSV314" and seconds < 2
    # at the pack's last declaration that grew the space (its new backend), not at a shipped file
    assert (problem.file, problem.line) == (os.path.join(directory, "amp.yaml"), 4), str(problem)
    # DSV314's wording, pinned here once (tests/engine/wording.yaml's `elsewhere:`); the counts
    # are the shipped rules' and the pack's, data
    assert re.fullmatch(r"the decision space has [\d,]+ points x \d+ backend choices = [\d,]+ inputs; "
                        r"the compiled form holds at most 67,108,864\. Declare fewer input values, or split "
                        r"the vocabulary into rule sets loaded separately", problem.message), problem.message
    report = dsv4sel.verify(paths)
    assert [(f.code, f.file, f.line) for f in report.findings] == [("DSV314", problem.file, 4)]
    # rules select() cannot load exit 2 from every command, check included (docs/cli.md)
    result = run("check", "--rules", directory)
    assert result.rc == 2 and "DSV314" in result.out, result.out


@pytest.fixture
def hostile_files(tmp_path):
    """A FIFO and a link to /dev/zero, both named like the files a command reads."""
    directory = tmp_path / "hostile"
    directory.mkdir()
    os.mkfifo(directory / "fifo.yaml")
    (directory / "zero.yaml").symlink_to("/dev/zero")
    return directory


def _timed(*args: str):
    """``dsv4sel ARGS`` and the CPU seconds its process took."""
    with CpuTimer() as timer:
        result = run(*args)
    return result, timer.seconds


def test_dsv4sel_test_refuses_a_fifo_and_dev_zero_without_reading_them(hostile_files):
    result, seconds = _timed("test", str(hostile_files))
    assert result.rc == 2 and seconds < 10
    for name in ("fifo.yaml", "zero.yaml"):
        assert f"{name}:1:1: cannot read rule file: not a regular file; rule files are regular *.yaml files" in result.err, result.err


@pytest.mark.parametrize("name", ["fifo.yaml", "zero.yaml"])
def test_table_check_refuses_a_fifo_and_dev_zero_without_reading_them(hostile_files, name):
    result, seconds = _timed("table", "--format", "md", "--check", str(hostile_files / name))
    assert result.rc == 2 and seconds < 10
    assert "not a regular file; a generated table is a regular file" in result.err, result.err
