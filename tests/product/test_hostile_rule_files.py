"""Hostile rule files give one located error, fast and in bounded memory.

The corpus lives in ``tests/product/hostile/``: each file states, on its second
line, the exact error it must give (``# error: LINE:COL: MESSAGE``). Files
that cannot be committed (a FIFO, a link to /dev/zero, a 2 MiB file, an
unreadable directory) are made by the tests below.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import dsv4sel
from dsv4sel import RuleError
from dsv4sel.engine.load import MAX_FILE_BYTES
from dsv4sel.engine.sources import default_packs

from _cli import COMMAND, environ

CORPUS = Path(__file__).with_name("hostile")
FILES = sorted(CORPUS.glob("*.yaml"))
#: Bounds every hostile run must stay within.
MEMORY_LIMIT = 1 << 30
TIME_LIMIT = 20
RAW_CONTROL = ("\x1b", "\x07", "\u202e")


def expected_error(path: Path) -> str:
    header = path.read_bytes().split(b"\n")[1].decode()
    assert header.startswith("# error: "), f"{path.name}: line 2 must state the expected error"
    return header[len("# error: "):]


def pack_with(tmp_path: Path, path: Path) -> Path:
    pack = tmp_path / "pack"
    pack.mkdir()
    (pack / path.name).write_bytes(path.read_bytes())
    return pack


def _limit_memory():  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_bounded(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``dsv4sel ARGS`` under a 1 GiB address-space limit and a 20 s timeout."""
    return subprocess.run(COMMAND + list(args), capture_output=True, text=True, cwd=cwd, env=environ(),
                          timeout=TIME_LIMIT, preexec_fn=_limit_memory)


def assert_one_clean_error(proc: subprocess.CompletedProcess, error: str) -> None:
    """Exit 1 or 2, one line naming ``error``'s location and message (``check``
    puts its severity and kind between the two), no traceback, no raw control
    character."""
    text = proc.stdout + proc.stderr
    assert proc.returncode in (1, 2), (proc.returncode, text[-3000:])
    file, line, column, message = error.split(":", 3)
    location = f"{file}:{line}:{column}:"
    assert any(location in row and row.endswith(message) for row in text.splitlines()), text[-3000:]
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]
    assert not any(c in text for c in RAW_CONTROL), "a control character reached the output"


#: The code each corpus file's problem carries (:mod:`dsv4sel.engine.codes`).
CODES = {
    "bidi_in_message": "DSV109", "billion_laughs": "DSV108", "deep_nesting": "DSV108", "duplicate_key": "DSV106",
    "escape_in_reason": "DSV109", "escape_in_rule_id": "DSV109", "float_integer": "DSV201",
    "huge_integer": "DSV107", "newline_in_backend_name": "DSV201", "not_utf8": "DSV101",
    "octal_block_size": "DSV107", "python_tag": "DSV104", "recursive_alias": "DSV108",
    "unknown_int_and_bool_keys": "DSV203", "unknown_scope_in_pack": "DSV301",
}


def test_the_corpus_covers_every_attack_the_issue_names():
    names = {p.stem for p in FILES}
    assert {"billion_laughs", "recursive_alias", "deep_nesting", "huge_integer", "escape_in_rule_id",
            "escape_in_reason", "newline_in_backend_name", "float_integer", "octal_block_size",
            "unknown_scope_in_pack"} <= names


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_load_rules_raises_rule_error_at_the_hostile_file(path, tmp_path, monkeypatch):
    pack = pack_with(tmp_path, path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuleError) as info:
        dsv4sel.load_rules(paths=[*default_packs(), str(pack)], use_cache=False)
    ours = [p for p in info.value.problems if p.file == f"pack/{path.name}"]
    assert ours and str(ours[0]) == f"pack/{path.name}:{expected_error(path)}", info.value.problems
    assert ours[0].code == CODES[path.stem]
    # the pack's problem is reported at the pack's file, nowhere else
    assert all(p.file == f"pack/{path.name}" for p in info.value.problems), info.value.problems


@pytest.mark.parametrize("command", [("check",), ("explain", "--platform", "cuda", "--capability", "9.0")])
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_the_cli_gives_one_located_error_in_bounded_time_and_memory(path, command, tmp_path):
    pack = pack_with(tmp_path, path)
    proc = run_bounded(*command, "--rules", str(pack.name), cwd=tmp_path)
    assert_one_clean_error(proc, f"pack/{path.name}:{expected_error(path)}")


def test_select_raises_rule_error_for_a_hostile_pack_on_the_rules_path(tmp_path, monkeypatch):
    pack = pack_with(tmp_path, CORPUS / "billion_laughs.yaml")
    monkeypatch.setenv("DSV4SEL_RULES_PATH", str(pack))
    monkeypatch.setattr(dsv4sel.api, "_default", None)
    with pytest.raises(RuleError) as info:
        dsv4sel.select(platform="cuda", capability="9.0")
    assert [(p.code, p.line) for p in info.value.problems] == [
        ("DSV108", int(expected_error(CORPUS / "billion_laughs.yaml").split(":")[0]))]  # the bound, at its line


# ------------------------------------------------------------ special files

def special_pack(tmp_path: Path, kind: str) -> Path:
    pack = tmp_path / "pack"
    pack.mkdir()
    target = pack / "a.yaml"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dev-zero":
        target.symlink_to("/dev/zero")
    elif kind == "directory":
        target.mkdir()
    elif kind == "oversize":
        # generated: a file over the size bound is not worth committing
        target.write_text("kind: vocabulary\n" + "#" * (MAX_FILE_BYTES + 10) + "\n")
    return pack


SPECIAL = {
    "fifo": "pack/a.yaml:1:1: cannot read rule file: not a regular file; rule files are regular *.yaml files",
    "dev-zero": "pack/a.yaml:1:1: cannot read rule file: not a regular file; rule files are regular *.yaml files",
    "directory": "pack/a.yaml:1:1: cannot read rule file: a directory; rule files are regular *.yaml files",
    "oversize": f"pack/a.yaml:1:1: cannot read rule file: {MAX_FILE_BYTES + 28} bytes; a rule file may have "
                f"at most {MAX_FILE_BYTES}",
}


@pytest.mark.parametrize("kind", SPECIAL)
def test_special_files_are_refused_without_reading_them(kind, tmp_path):
    special_pack(tmp_path, kind)
    for command in (("check",), ("explain", "--platform", "cuda")):
        assert_one_clean_error(run_bounded(*command, "--rules", "pack", cwd=tmp_path), SPECIAL[kind])


def test_an_unreadable_pack_directory_is_a_located_rule_error(tmp_path, monkeypatch):
    # the tests may run as root, for whom no permission bit stops a listing: fake the refusal
    pack = tmp_path / "locked"
    pack.mkdir()
    real_listdir = os.listdir

    def listdir(path="."):
        if os.path.abspath(path) == str(pack):
            raise PermissionError(13, "Permission denied", str(path))
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuleError) as info:
        dsv4sel.load_rules(paths=[*default_packs(), str(pack)], use_cache=False)
    assert [str(p) for p in info.value.problems] == [
        "locked:1:1: cannot list the rule directory: Permission denied"]
    report = dsv4sel.verify([*default_packs(), str(pack)])
    assert [(f.file, f.message) for f in report.findings] == [
        ("locked", "cannot list the rule directory: Permission denied")]


def test_a_file_name_with_control_characters_is_shown_escaped(tmp_path):
    pack = tmp_path / "pack"
    pack.mkdir()
    # written here: the point is the file's name, which holds control characters no repository should
    (pack / "evil\x1b[2J.yaml").write_text("kind: vocabulary\ninputs: {x: 1}\n")
    proc = run_bounded("check", "--rules", "pack", cwd=tmp_path)
    assert_one_clean_error(proc, "pack/evil\\x1b[2J.yaml:2:13: $.inputs.x: 1 is not of type 'object'")


def _not_utf8_pack(tmp_path: Path) -> Path:
    """A pack directory named with a byte that is not UTF-8, holding one rule file named so too
    (made here: no repository should hold such names); its file has a problem at 2:13."""
    pack = Path(os.fsdecode(bytes(tmp_path) + b"/pack\xfe"))
    pack.mkdir()
    (pack / os.fsdecode(b"evil\xff.yaml")).write_text("kind: vocabulary\ninputs: {x: 1}\n")
    return pack


NOT_UTF8 = "pack\\xfe/evil\\xff.yaml:2:13: $.inputs.x: 1 is not of type 'object'"


@pytest.mark.parametrize("command", [("check",), ("explain", "--platform", "cuda"),
                                     ("test", "--rules"), ("table", "--rules"), ("doctor", "--rules")])
def test_a_file_name_that_is_not_utf8_is_one_located_error_everywhere(command, tmp_path):
    # Python keeps the bytes as lone surrogates, which no output can encode: once a
    # UnicodeEncodeError (exit 3) from explain, test and doctor, and from select()
    pack = _not_utf8_pack(tmp_path)
    args = [*command, pack.name] if command[-1] == "--rules" else [*command, "--rules", pack.name]
    if command[0] == "test":
        args.append(str(Path(__file__).parents[1] / "decisions"))
    proc = run_bounded(*args, cwd=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert_one_clean_error(proc, NOT_UTF8)


def test_select_names_a_file_that_is_not_utf8_safely(tmp_path):
    pack = _not_utf8_pack(tmp_path)
    code = ("import dsv4sel\ntry:\n    dsv4sel.select(platform='cuda', capability='9.0')\n"
            "except dsv4sel.RuleError as exc:\n    print(exc.problems[0])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env=environ(DSV4SEL_RULES_PATH=os.fsdecode(bytes(pack))))
    assert proc.returncode == 0 and proc.stdout.strip() == NOT_UTF8, (proc.stdout, proc.stderr[-2000:])


# ------------------------------------------------------------ YAML 1.2 scalars

@pytest.mark.parametrize("text,value", [
    ("yes", "yes"), ("on", "on"), ("No", "No"),          # strings in YAML 1.2, booleans in 1.1
    ("true", True), ("False", False), ("~", None), ("null", None),
    ("0o17", 15), ("0x1f", 31), ("-12", -12), ("1_000", "1_000"), ("1:20", "1:20"),
    ("8.0", 8.0), (".inf", float("inf")),
])
def test_scalars_follow_the_yaml_1_2_core_schema(text, value):
    from dsv4sel.engine.load import load_text

    loaded, problems = load_text(f"v: {text}\n", "t.yaml")
    assert problems == [] and loaded.data["v"] == value and type(loaded.data["v"]) is type(value)


def test_aliases_within_bounds_still_work(tmp_path, monkeypatch):
    # the shipped rules share messages through anchors; a bounded expansion keeps that working
    from dsv4sel.engine.load import load_text

    loaded, problems = load_text("a: &m [x, y]\nb: *m\nc: *m\n", "t.yaml")
    assert problems == [] and loaded.data == {"a": ["x", "y"], "b": ["x", "y"], "c": ["x", "y"]}


#: In a child: each corpus file loaded once with the shipped rules (after one untimed load, so
#: that importing the YAML and schema libraries is not counted), with the CPU time it took (the
#: cost of the file, not of the machine's other load) and the growth of peak RSS.
BOUND_CHILD = """
import json, resource, shutil, sys, tempfile, time
from pathlib import Path
import dsv4sel
from dsv4sel.engine.sources import default_packs

def load(path):
    pack = Path(tempfile.mkdtemp()) / "pack"
    pack.mkdir()
    shutil.copy(path, pack / path.name)
    try:
        dsv4sel.load_rules([*default_packs(), str(pack)], use_cache=False)
        return "loaded"
    except dsv4sel.RuleError as exc:
        return exc.problems[0].code

files = [Path(p) for p in sys.argv[1:]]
load(files[0])
out = {}
for path in files:
    before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.process_time()
    code = load(path)
    out[path.stem] = [code, time.process_time() - start, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024]
print(json.dumps(out))
"""


def test_every_corpus_file_is_refused_within_2_s_and_200_mb():
    # issue 17's bound for every hostile file: its located error within 2 s and 200 MB
    proc = subprocess.run([sys.executable, "-c", BOUND_CHILD, *map(str, FILES)], capture_output=True, text=True,
                          cwd=CORPUS.parents[2], env=environ(), timeout=120, preexec_fn=_limit_memory, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert {name: code for name, (code, _, _) in got.items()} == CODES
    slow = {name: (seconds, grown) for name, (_, seconds, grown) in got.items() if seconds >= 2 or grown >= 200 << 20}
    assert not slow, slow
