"""Terminal escapes from untrusted text (issue 17 point 9): a colour code, a cursor move or
any other control character in a query value, a file name, an impl module's import error or
a cached rule message reaches neither a Python caller (``str(SelectionError)``,
``InvalidQuery``, ``RuleError``, ``ImplLoadError``, ``Selection.messages``, ``verify()``'s
findings), nor the vLLM plugin's log, nor a colour terminal, while the colour the CLI itself
adds still does. Also: a capability naming two GPUs at once gets a message naming both."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _cli import ANSI, REPO, environ, run, run_tty

import dsv4sel
from dsv4sel.engine import cache
from dsv4sel.engine.values import Message
from dsv4sel.errors import ImplLoadError, Problem, RuleError, SelectionError

RED = "\x1b[31mFORGED\x1b[0m"
#: Each must come out as escapes; the set spans colour (SGR), other CSI, OSC, a C1 CSI and bidi.
HOSTILE = [RED, "\x1b[2J\x1b[H", "\x1b]0;title\x07", "\x9b31m", "\u202eevil"]
CONTROLS = ("\x1b", "\x07", "\x9b", "\u202e")


def raw(text: str) -> bool:
    return any(c in text for c in CONTROLS)


class EvilRepr:
    """A query value whose repr is itself a colour code (any object can be passed)."""

    def __repr__(self) -> str:
        return RED

    __str__ = __repr__

    def __hash__(self) -> int:
        return 0


QUERIES = {
    "platform": lambda v: {"platform": v},
    "capability": lambda v: {"platform": "cuda", "capability": v},
    "backend": lambda v: {"platform": "cuda", "capability": "9.0", "backend": v},
    "kv_cache_dtype": lambda v: {"platform": "cuda", "capability": "9.0", "kv_cache_dtype": v},
    "model": lambda v: {"platform": "cuda", "capability": "9.0", "model": v},
    "extra input value": lambda v: {"platform": "cuda", "capability": "9.0", "mega_attn": v},
}


@pytest.mark.parametrize("where", QUERIES)
@pytest.mark.parametrize("value", [*HOSTILE, EvilRepr()], ids=ascii)
def test_a_query_value_reaches_a_python_caller_escaped(where, value):
    if where == "backend" and isinstance(value, EvilRepr):
        value = type("Named", (), {"name": RED})()  # an enum-like member whose name is hostile
    with pytest.raises(dsv4sel.InvalidQuery) as info:
        dsv4sel.select(**QUERIES[where](value))
    exc = info.value
    assert not raw(str(exc)) and not raw(exc.reason) and not any(map(raw, exc.suggestions)), str(exc)


def test_an_unknown_input_name_is_escaped():
    with pytest.raises(dsv4sel.InvalidQuery) as info:
        dsv4sel.select(platform="cuda", capability="9.0", **{RED: "x"})
    assert "\\x1b[31mFORGED" in str(info.value) and not raw(str(info.value))


def test_the_error_types_neutralise_what_they_are_given():
    # the guarantee behind every message: whatever a caller or a stage hands them
    assert str(SelectionError(f"no {RED}", suggestions=(RED,))) == (
        "no \\x1b[31mFORGED\\x1b[0m\nWould work: \\x1b[31mFORGED\\x1b[0m")
    error = RuleError([Problem(f"pack{RED}.yaml", 3, 1, f"bad {RED}\nsecond line", "DSV101")])
    (problem,) = error.problems
    assert problem.file == "pack\\x1b[31mFORGED\\x1b[0m.yaml"
    assert problem.message == "bad \\x1b[31mFORGED\\x1b[0m\nsecond line"  # newlines of a message stay
    assert not raw(str(error)) and not raw(str(ImplLoadError(RED)))
    assert Message(RED, "warning") == "\\x1b[31mFORGED\\x1b[0m" and Message(RED).level == "info"


def _module_raising(tmp_path: Path) -> tuple[Path, Path]:
    """A pack whose impl module raises, at import, an exception whose text is a colour code."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "evilimpl.py").write_text(f"raise RuntimeError({RED!r})\n")
    pack = tmp_path / "pack"
    pack.mkdir()
    clean = (REPO / "examples" / "mistakes" / "clean" / "my.yaml").read_text()
    (pack / "my.yaml").write_text(clean.replace("dsv4sel.kernels.reference:DeepseekV4ReferenceSparseImpl",
                                                "evilimpl:Impl"))
    return code, pack


def test_an_impl_module_that_raises_a_colour_code_is_reported_escaped(tmp_path):
    code, pack = _module_raising(tmp_path)
    env = environ(PYTHONPATH=str(code))
    args = ("check", "--rules", str(pack), "--allow-impl-module", "evilimpl")
    data = json.loads(run(*args, "--json", env=env).out)
    (finding,) = [f for f in data["findings"] if f["code"] == "DSV406"]
    assert "RuntimeError: \\x1b[31mFORGED\\x1b[0m" in finding["message"], finding
    tty = run_tty(*args, env=env)
    unwrapped = " ".join(tty.out.split())  # the terminal's width decides where the message wraps
    assert tty.rc == 1 and "RuntimeError: \\x1b[31mFORGED" in unwrapped and not raw(ANSI.sub("", tty.out)), tty


@pytest.mark.parametrize("argv", [
    ("check", f"--{RED}"),                       # argparse echoes an unknown option
    ("table", "--check", f"/nonexistent/{RED}.md"),  # table --check names its file
    ("explain", "--platform", "cuda", "--input", f"{RED}=x"),
    ("explain", "--platform", "cuda", "--rules", f"/nonexistent/{RED}"),
])
def test_the_cli_writes_hostile_text_as_escapes_on_a_colour_terminal(argv):
    result = run_tty(*argv, both=True)
    assert result.rc in (1, 2), result
    assert "\\x1b[31mFORGED" in result.out, result
    assert "\x1b[31mFORGED" not in result.out, result


def test_the_cli_keeps_its_own_colour_on_a_colour_terminal():
    # the control of the test above: colour codes do reach a terminal, the CLI's own
    result = run_tty("doctor", "--platform", "cuda", "--capability", "9.0")
    assert ANSI.search(result.out), result


#: In the child: answer from a private cache entry whose every selection carries a message
#: holding a colour code, and log it through the vLLM integration's logger.
CHILD = textwrap.dedent("""
    import json, logging, sys
    from dsv4sel import api
    api.SHIPPED_ARTIFACT = "/nonexistent/shipped.dsv4c"
    import dsv4sel, dsv4sel.vllm as integration
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    integration.logger.addHandler(handler)
    integration.logger.setLevel(logging.INFO)
    s = dsv4sel.select(platform="cuda", capability="9.0")
    integration._log_messages(s)
    print(json.dumps({"messages": list(s.messages), "levels": [m.level for m in s.messages], "log": lines}))
""")


def _child(directory: Path) -> dict:
    env = environ(DSV4SEL_CACHE_DIR=str(directory), DSV4SEL_NO_CACHE=None)
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, cwd=REPO, check=False,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_cached_rule_message_reaches_selection_messages_and_the_log_escaped(tmp_path):
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    _child(directory)  # compiles and writes the user's own entry
    (entry,) = directory.glob("*" + cache.SUFFIX)
    decoded = cache.decode(entry.read_bytes())
    outcomes = decoded.data["table"]["outcomes"]
    # kind, backend, six select fields, then the messages: a private entry is trusted (the threat
    # model), so this is what the user's own account could write; its text is still shown escaped
    decoded.data["table"]["outcomes"] = [(*row[:9], (("warning", RED),), *row[10:]) if row[0] == "select" else row
                                         for row in outcomes]
    entry.write_bytes(cache.encode(decoded.data, bytes(decoded.blob)))
    entry.chmod(0o600)
    got = _child(directory)
    assert got["messages"] == ["\\x1b[31mFORGED\\x1b[0m"] and got["levels"] == ["warning"], got
    assert got["log"] == ["\\x1b[31mFORGED\\x1b[0m"], got


def test_the_vllm_plugin_logs_escaped_lines(caplog):
    from dsv4sel import vllm_plugin

    caplog.set_level(logging.INFO, logger=vllm_plugin.logger.name)
    vllm_plugin._say_once(logging.INFO, f"dsv4sel: {RED} is not a DeepSeek-V4 model")
    assert [r.getMessage() for r in caplog.records if "FORGED" in r.getMessage()] == [
        "dsv4sel: \\x1b[31mFORGED\\x1b[0m is not a DeepSeek-V4 model"]


@pytest.mark.parametrize("capability, named, suggested", [
    ("H100 A100", "H100 (9.0) and A100 (8.0)", ("--capability H100", "--capability A100")),
    ("NVIDIA H100 and NVIDIA B200", "H100 (9.0) and B200 (10.0)", ("--capability H100", "--capability B200")),
    ("H100 MI300X", "H100 (9.0) and MI300X (gfx942)", ("--capability H100",)),  # MI300X is not a cuda GPU
])
def test_two_gpu_names_at_once_get_a_message_naming_both(capability, named, suggested):
    with pytest.raises(dsv4sel.InvalidQuery) as info:
        dsv4sel.select(platform="cuda", capability=capability)
    assert info.value.reason == (f"capability {capability!r} names 2 GPUs at once, {named}: give one, the GPU "
                                 "this process runs on")
    assert info.value.suggestions == suggested
    # and on the command line, the same words
    result = run("explain", "--platform", "cuda", "--capability", capability)
    assert result.rc == 2 and f"names 2 GPUs at once, {named}: give one" in " ".join(result.err.split())


def test_one_gpu_named_twice_or_in_full_still_decides():
    for capability in ("H100 H200", "NVIDIA H100 80GB HBM3", "H100"):
        assert dsv4sel.select(platform="cuda", capability=capability).query.capability == "9.0"


def test_the_same_text_stays_unescaped_when_it_is_printable():
    # a message without control characters is the very same string: no cost, no change
    text = "FlashMLA serves fp8_ds_mla on SM90"
    assert Message(text) == text and str(SelectionError(text)) == text
