#!/usr/bin/env python3
"""Keep every console sample, Python sample and count in README.md and docs/ equal to what the
tools print.

Usage::

    python tools/doc_samples.py --check [FILE.md ...]   # exit 1 with a diff when one is stale
    python tools/doc_samples.py --write [FILE.md ...]   # regenerate them in place (`make docs`)

Without files it reads README.md and every docs/*.md except the files generated whole
(docs/backends.md, docs/vllm-X-fixes.md, which have their own generators). Three kinds of
generated text, each marked in the Markdown itself so that a reader sees where it comes from:

**Console samples.** A fenced block whose info string starts with ``console`` and whose first
line starts with ``$ ``. Every ``$ `` line is a command run from the repository root; the lines
up to the next ``$ `` line (or the fence) are its output, stdout and stderr together, as a
pipe gets them (no colour; not wrapped, except ``explain``'s report, at 100 columns). Commands
are ``dsv4sel ...`` (run with the interpreter running this tool, so the checkout's own code) or
``export NAME=VALUE`` (set for the later commands of the block); ``# ...`` ends a command as
in a shell. Words after ``console`` in the info string select the lines shown, so a long
report can be quoted in part and still be checked: ``head=N`` (the first N lines), ``tail=N``
(the last N), ``grep=REGEX`` (lines matching it, ``re.search``), ``paragraphs=N`` (the first N
blank-line-separated paragraphs). Every run of lines left out becomes one ``...`` line, indented
as the first line it stands for.

**Python samples.** A fenced ``pycon`` block is a doctest-style session: ``>>> `` and ``... ``
lines are source, the other lines the expected output (a value's ``repr``, what it prints, or
``Traceback (most recent call last):`` / ``  ...`` / the exception's last line). The statements
of one file run in one namespace, in order, from the repository root.

**Counts.** ``<!-- fact NAME -->TEXT<!-- /fact -->`` inline: TEXT is the fact NAME of
:data:`FACTS`, computed from a tool's ``--json`` document (``NAME:,`` writes it with thousands
separators, ``273,240``).

**Upgrade pages.** ``docs/upgrade-HOST-OLD-to-NEW.md`` for each two consecutive releases of a host
in the host registry whose compat rule sets are both under ``rules/compat/``: generated whole
(:data:`UPGRADE_PAGE` around what ``dsv4sel upgrade HOST OLD NEW`` prints), checked and written
with the rest when no files are named; a page that should exist and does not is stale.

Output is compared byte for byte, after dropping trailing spaces of each line (Markdown and
editors drop them too). A sample whose command exits 3 or prints a traceback is an error of
the sample, never written into the docs.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: Generated whole by their own tools (`dsv4sel table`, tools/vllm_fix_cubes.py: one per vLLM release).
WHOLE_FILE_GENERATED = {"docs/backends.md", "docs/vllm-*-fixes.md"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>[^`]*)$")
FACT = re.compile(r"<!-- fact (?P<name>[\w.]+)(?P<fmt>:,)? -->(?P<text>.*?)<!-- /fact -->")
RUN_CLI = "import sys; from dsv4sel.cli import main; sys.exit(main())"
PYTHON = sys.executable


class SampleError(Exception):
    """A sample that cannot be generated (an unknown command, a traceback, an unknown fact)."""


@dataclass(frozen=True)
class Fact:
    """One count the docs quote: the value at ``path`` (keys joined by ``.``; ``#len`` is the
    length of the list so far) of the JSON document ``command`` (dsv4sel's arguments) prints."""

    command: tuple[str, ...]
    path: str


B12X = ("--rules", "examples/b12x-pack/dsv4sel_b12x/rules", "--allow-impl-module", "dsv4sel_b12x")
#: Every count quoted in the docs, by name. Adding one: a name here and a marker in the text.
FACTS: dict[str, Fact] = {
    "shipped.files": Fact(("check", "--json"), "sources.#len"),
    "shipped.rules": Fact(("check", "--json"), "rule_count"),
    "shipped.tables": Fact(("check", "--json"), "table_count"),
    "shipped.points": Fact(("check", "--json"), "coverage.points"),
    "shipped.backend_choices": Fact(("check", "--json"), "coverage.backend_choices"),
    "shipped.inputs": Fact(("check", "--json"), "coverage.inputs"),
    "shipped.select": Fact(("check", "--json"), "coverage.totals.select"),
    "shipped.reject": Fact(("check", "--json"), "coverage.totals.reject"),
    "shipped.undecided": Fact(("check", "--json"), "coverage.totals.undecided"),
    "decisions.cases": Fact(("test", "tests/decisions", "--json"), "summary.cases"),
    "decisions.reached": Fact(("test", "tests/decisions", "--json"), "coverage.reached"),
    "decisions.rules": Fact(("test", "tests/decisions", "--json"), "coverage.rules"),
    "b12x.cases": Fact(("test", "examples/b12x-pack/tests", *B12X, "--json"), "summary.cases"),
    "b12x.reached": Fact(("test", "examples/b12x-pack/tests", *B12X, "--json"), "coverage.reached"),
    "b12x.rules": Fact(("test", "examples/b12x-pack/tests", *B12X, "--json"), "coverage.rules"),
}


def _environment(extra: dict[str, str]) -> dict[str, str]:
    """The environment a sample runs in: this machine's, minus what changes the output
    (colour, width, rule packs on the path), plus the block's ``export``s."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DSV4SEL_") and k not in ("COLUMNS", "PYTHONPATH", "FORCE_COLOR")}
    env.update(NO_COLOR="1", PYTHONUNBUFFERED="1", TERM="dumb", **extra)
    return env


def run_dsv4sel(argv: list[str], exports: dict[str, str]) -> str:
    """What ``dsv4sel ARGV`` prints, stdout and stderr interleaved as on a terminal."""
    proc = subprocess.run([PYTHON, "-c", RUN_CLI, *argv], cwd=REPO, env=_environment(exports),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if proc.returncode not in (0, 1, 2) or "Traceback (most recent call last)" in proc.stdout:
        raise SampleError(f"`dsv4sel {shlex.join(argv)}` exited {proc.returncode}:\n{proc.stdout[-2000:]}")
    return proc.stdout


def select_lines(lines: list[str], options: dict[str, str]) -> list[str]:
    """The lines a block's options keep; each run of dropped lines becomes one ``...``."""
    if not options:
        return lines
    keep = [False] * len(lines)
    if "head" in options:
        for i in range(min(int(options["head"]), len(lines))):
            keep[i] = True
    if "tail" in options:
        for i in range(max(0, len(lines) - int(options["tail"])), len(lines)):
            keep[i] = True
    if "grep" in options:
        pattern = re.compile(options["grep"])
        for i, line in enumerate(lines):
            keep[i] = keep[i] or bool(pattern.search(line))
    if "paragraphs" in options:
        wanted, seen = int(options["paragraphs"]), 0
        for i, line in enumerate(lines):
            if not line.strip() and i and lines[i - 1].strip():
                seen += 1
            if seen >= wanted:
                break
            keep[i] = True
    out: list[str] = []
    for i, line in enumerate(lines):
        if keep[i]:
            out.append(line)
        elif not i or keep[i - 1]:
            out.append(line[: len(line) - len(line.lstrip())] + "...")
    return out


def parse_options(info: str) -> dict[str, str]:
    words = shlex.split(info)[1:]
    options = {}
    for word in words:
        name, sep, value = word.partition("=")
        if not sep or name not in ("head", "tail", "grep", "paragraphs"):
            raise SampleError(f"unknown console sample option {word!r} (head=N, tail=N, grep=REGEX, paragraphs=N)")
        options[name] = value
    return options


def console_block(body: list[str], info: str) -> list[str]:
    """A console block regenerated: its ``$`` lines kept, their output replaced."""
    options = parse_options(info)
    exports: dict[str, str] = {}
    out: list[str] = []
    for line in body:
        if not line.startswith("$ "):
            continue
        out.append(line)
        words = shlex.split(line[2:], comments=True)
        if words and words[0] == "export":
            for item in words[1:]:
                name, _, value = item.partition("=")
                exports[name] = value
            continue
        if not words or words[0] != "dsv4sel":
            raise SampleError(f"a console sample runs only `dsv4sel ...` and `export NAME=VALUE`, not {line!r}")
        text = run_dsv4sel(words[1:], exports)
        out.extend(select_lines([s.rstrip() for s in text.rstrip("\n").split("\n")], options))
    return out


class Session:
    """The namespace the ``pycon`` blocks of one file share."""

    def __init__(self) -> None:
        self.namespace: dict = {"__name__": "__doc_sample__"}

    def run(self, source: str) -> str:
        buffer = io.StringIO()
        old_cwd = os.getcwd()
        os.chdir(REPO)
        try:
            with contextlib.redirect_stdout(buffer):
                try:
                    code = compile(source, "<sample>", "single")
                    exec(code, self.namespace)  # noqa: S102 - the docs' own samples
                except Exception as exc:  # noqa: BLE001 - the sample shows the exception, doctest-style
                    last = traceback.format_exception_only(type(exc), exc)[-1].rstrip("\n")
                    buffer.write(f"Traceback (most recent call last):\n  ...\n{last}\n")
        finally:
            os.chdir(old_cwd)
            sys.displayhook = sys.__displayhook__
        return buffer.getvalue()


def pycon_block(body: list[str], session: Session) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(body):
        line = body[i]
        if not line.startswith(">>>"):
            i += 1  # an expected output line: regenerated below
            continue
        source = [line[4:]]
        out.append(line)
        i += 1
        while i < len(body) and body[i].startswith("..."):
            source.append(body[i][4:])
            out.append(body[i])
            i += 1
        text = session.run("\n".join(source) + "\n")
        out.extend(s.rstrip() for s in text.rstrip("\n").split("\n") if text)
    return out


class Facts:
    """The facts, each command run once per run of the tool."""

    def __init__(self) -> None:
        self._documents: dict[tuple[str, ...], dict] = {}

    def value(self, name: str):
        try:
            fact = FACTS[name]
        except KeyError:
            raise SampleError(f"unknown fact {name!r}; known: {', '.join(sorted(FACTS))}") from None
        if fact.command not in self._documents:
            self._documents[fact.command] = json.loads(run_dsv4sel(list(fact.command), {}))
        value = self._documents[fact.command]
        for key in fact.path.split("."):
            value = len(value) if key == "#len" else value[key]
        return value


def regenerate(text: str, facts: Facts) -> str:
    """``text`` (one Markdown file) with every sample and fact regenerated."""
    lines = text.split("\n")
    out: list[str] = []
    session = Session()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match or not match["info"].strip():
            out.append(_facts(lines[i], facts))
            i += 1
            if match:  # an unmarked fence: copy it through to its end untouched
                while i < len(lines) and not lines[i].strip().startswith(match["fence"]):
                    out.append(lines[i])
                    i += 1
                if i < len(lines):
                    out.append(lines[i])
                    i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].strip() != match["fence"]:
            end += 1
        body = lines[i + 1:end]
        info = match["info"].strip()
        language = info.split()[0]
        if language == "console" and body and body[0].startswith("$ "):
            body = console_block(body, info)
        elif language == "pycon":
            body = pycon_block(body, session)
        out.extend([lines[i], *body])
        if end < len(lines):
            out.append(lines[end])
        i = end + 1
    return "\n".join(out)


def _facts(line: str, facts: Facts) -> str:
    def replace(match: re.Match) -> str:
        value = facts.value(match["name"])
        shown = f"{value:,}" if match["fmt"] else str(value)
        return f"<!-- fact {match['name']}{match['fmt'] or ''} -->{shown}<!-- /fact -->"

    return FACT.sub(replace, line)


def default_files() -> list[Path]:
    docs = sorted(p for p in (REPO / "docs").glob("*.md")
                  if not any(p.relative_to(REPO).match(pattern) for pattern in WHOLE_FILE_GENERATED)
                  and not UPGRADE_NAME.match(p.name))
    return [REPO / "README.md", *docs]


UPGRADE_NAME = re.compile(r"upgrade-[\w.-]+-to-[\w.]+\.md$")
UPGRADE_PAGE = """\
<!-- Generated by `make docs` (tools/doc_samples.py) from {old_rules} and {new_rules}; do not edit. -->
# Upgrading {label} {old} to {new}: what changes for DeepSeek-V4

What {label} {new} itself decides differently from {label} {old} for DeepSeek-V4 and V4.1, as
the two releases' compat rule sets state it (each release's own decisions, wrong ones included,
checked against the real release by its differential suite):
`{old_rules}` and `{new_rules}`. This is what an upgrade changes where {label} decides alone;
with dsv4sel's plugin the shipped rules decide on both releases, and [{host}.md]({host}.md)
lists where they differ from each.

```console
$ dsv4sel upgrade {host} {old} {new}
{report}
```

Every input is one combination of the decision's inputs (platform, capability,
`--attention-backend`, `--kv-cache-dtype` and the inputs the rules declare, such as `lora`), and
each changed one is counted under one heading: an input the older release ignores that decides
now; an `--attention-backend` name one release builds and the other refuses (or does not know);
with no backend named, another default backend, or a decision that became a refusal (or an
error {label} raises) and the reverse; with both building the same backend, another {label}
class, cache format or block size. Under each heading come its largest groups: how many inputs,
what {old} does -> what {new} does (only what differs), and the first cube of those inputs (an
input a cube does not name takes every value; `...(+N)` stands for N more values). Refusals
worded differently and log lines are counted, not listed.
`dsv4sel upgrade {host} {old} {new} --json` lists every group, every cube and each exact
outcome; [cli.md](cli.md#dsv4sel-upgrade) describes the command.
"""


def upgrade_pages() -> dict[Path, str]:
    """Every upgrade page the registry and the compat sets present call for, as it should read."""
    from dsv4sel.dsv4.host_registry import HOSTS
    from dsv4sel.tools.releases import release_name

    pages = {}
    for host in HOSTS.values():
        for old, new in zip(host.releases, host.releases[1:]):
            if not all((REPO / "rules" / r.compat).is_dir() for r in (old, new)):
                continue
            short = [release_name(r.version) for r in (old, new)]
            report = run_dsv4sel(["upgrade", host.name, *short], {})
            pages[REPO / "docs" / f"upgrade-{host.name}-{short[0]}-to-{short[1]}.md"] = UPGRADE_PAGE.format(
                host=host.name, label=host.label, old=short[0], new=short[1], old_rules=f"rules/{old.compat}",
                new_rules=f"rules/{new.compat}", report="\n".join(line.rstrip() for line in report.rstrip("\n").split("\n")))
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="doc_samples.py", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff when a sample is stale")
    mode.add_argument("--write", action="store_true", help="regenerate the samples in place")
    parser.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md, docs/*.md)")
    args = parser.parse_args(argv)
    facts = Facts()
    stale = []
    try:
        pages = {} if args.files else upgrade_pages()
    except SampleError as exc:
        print(f"upgrade pages: {exc}", file=sys.stderr)
        return 2
    for path in [*(args.files or default_files()), *pages]:
        old = path.read_text(encoding="utf-8") if path.exists() or path not in pages else ""
        try:
            new = pages[path] if path in pages else regenerate(old, facts)
        except SampleError as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            return 2
        if _normal(new) == _normal(old):
            continue
        if args.write:
            path.write_text(new, encoding="utf-8")
            print(f"wrote {path}")
            continue
        stale.append(path)
        shown = os.path.relpath(path)
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                   f"{shown} (committed)", f"{shown} (the tools print)"))
    if stale:
        print(f"\n{len(stale)} file(s) with stale samples: {', '.join(os.path.relpath(p) for p in stale)}\n"
              f"regenerate them with `make docs` (python tools/doc_samples.py --write)", file=sys.stderr)
        return 1
    return 0


def _normal(text: str) -> list[str]:
    return [line.rstrip() for line in text.split("\n")]


if __name__ == "__main__":
    sys.exit(main())
