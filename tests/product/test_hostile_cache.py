"""Hostile cache entries, installed packs and query strings (issue 17).

Each case is an attack from the issue with the answer it must give. Cache
entries run in a fresh process with a memory cap (RLIMIT_AS) and a timeout:
the process must give the right answers within 2 s and grow by less than
200 MB, or the test fails instead of hanging CI.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import dsv4sel
from dsv4sel.engine import cache

from _bounds import CpuTimer
from _repo import REPO

#: Run in the child: load the shipped rules with the packaged artifact out of the way,
#: answer the probes, and report time and memory growth.
CHILD = textwrap.dedent("""
    import json, os, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.process_time()  # CPU seconds: the bound holds whatever else the machine runs
    import dsv4sel
    from dsv4sel import api
    api.SHIPPED_ARTIFACT = os.devnull + ".none"
    out = []
    for q in [dict(platform="cuda", capability="9.0"), dict(platform="cuda", capability="12.0", kv_cache_dtype="fp8"),
              dict(platform="cuda", capability="9.0", kv_cache_dtype="bfloat16")]:
        try:
            s = dsv4sel.select(**q)
            out.append([s.backend, s.impl, s.bytes_per_token, s.block_size, dict(s.rewrites)])
        except dsv4sel.SelectionError as e:
            out.append(["rejected", type(e).__name__])
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    print(json.dumps({"answers": out, "seconds": time.process_time() - t, "grown": grown,
                      "compiled": "yaml" in sys.modules}))
""")


def child(cache_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DSV4SEL_NO_CACHE",)}
    env["DSV4SEL_CACHE_DIR"] = str(cache_dir)
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=60,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def truth(tmp_path_factory):
    """The right answers, and an intact user-cache entry for the shipped rules."""
    directory = tmp_path_factory.mktemp("truth-cache")
    first = child(directory)
    (entry,) = directory.glob("*" + cache.SUFFIX)
    return first["answers"], entry.read_bytes(), entry.name


def forged(raw: bytes, edit) -> bytes:
    """``raw`` decoded, edited by ``edit`` and encoded again with a valid checksum."""
    entry = cache.decode(raw)
    edit(entry.data)
    return cache.encode(entry.data, bytes(entry.blob))


def _first_select(data, change):
    outcomes = list(data["table"]["outcomes"])
    i = next(i for i, row in enumerate(outcomes) if row[0] == "select")
    outcomes[i] = change(list(outcomes[i]))
    data["table"]["outcomes"] = outcomes


def _set(index, value):
    def change(row):
        row[index] = value
        return tuple(row)
    return lambda data: _first_select(data, change)


def _header(json_len: int, blob_len: int, body: bytes = b"") -> bytes:
    return cache.MAGIC + json_len.to_bytes(4, "big") + blob_len.to_bytes(4, "big") + b"\0\0\0\0" + body


N_FIELDS = 2 + 6  # kind, backend, then the profile's six select fields
#: name -> how the entry is made from the intact one. Every one must be ignored or refused,
#: and the shipped answers given.
FORGED = {
    "rewrite names __dict__": _set(N_FIELDS, (("__dict__", "x"),)),
    "rewrite value of the wrong type": _set(N_FIELDS, (("cache_dtype", 5),)),
    "rewrite key with a capital": _set(N_FIELDS, (("Cache_dtype", "fp8"),)),
    "host class outside its host's package": _set(N_FIELDS + 3, (("vllm", "vllm_evil.x:Anything", ">=0.33"),)),
    "host class in os": _set(N_FIELDS + 3, (("vllm", "os:system", ">=0.33"),)),
    "message level not info/warning": _set(N_FIELDS + 1, (("error", "x"),)),
    "digest of the wrong type": lambda data: data.update(digest=12345),
    "digest not hex": lambda data: data.update(digest="z" * 64),
    "fingerprint length past the blob": lambda data: data.update(fingerprint=1 << 40),
    "typecode d": lambda data: data["table"]["table"].update(typecode="d"),
    "dimension order reversed": lambda data: data["table"]["table"].update(
        order=tuple(reversed(data["table"]["table"]["order"]))),
    "70,000 outcome rows": lambda data: data["table"].update(outcomes=[("gap", None, "t", ())] * 70_000),
}

RAW = {
    "marshal body claiming 2^31-1 items": b"dsv4sel-cache-2\n\0\0\0\0" + b"[\xff\xff\xff\x7f" + b"\0" * 20,
    "header claiming 8 MiB of JSON in 40 bytes": _header(8 << 20, 0, b"{}"),
    "header claiming 4 GiB": _header(0xFFFFFFFF, 0xFFFFFFFF),
    "1,000 nested headers": cache.MAGIC * 1000,
    "JSON nested 1,000 deep": cache.encode({"x": 0}, b"")[:0] + (lambda t: _header(len(t), 0, t))(
        b"[" * 1000 + b"]" * 1000),
    "2 million empty lists (6 MB of JSON)": (lambda t: _header(len(t), 0, t))(
        b'{"table":{"outcomes":[' + b",".join([b"[]"] * 2_000_000) + b"]}}"),
    "truncated": None,  # filled in from the intact entry
    "empty": b"",
}


def _fix_crc(raw: bytes) -> bytes:
    """An entry whose CRC-32 matches its body, as someone who knows the format writes it."""
    import zlib

    if len(raw) < len(cache.MAGIC) + 12:
        return raw
    n = len(cache.MAGIC)
    crc = zlib.crc32(raw[n + 12:])
    return raw[:n + 8] + crc.to_bytes(4, "big") + raw[n + 12:]


@pytest.mark.parametrize("name", [*FORGED, *RAW])
def test_a_hostile_entry_is_refused_within_bounds(truth, tmp_path, name):
    answers, intact, entry_name = truth
    if name in FORGED:
        raw = forged(intact, FORGED[name])
    elif name == "truncated":
        raw = intact[:len(intact) // 2]
    else:
        raw = _fix_crc(RAW[name])
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    (directory / entry_name).write_bytes(raw)
    result = child(directory)
    assert result["answers"] == answers
    assert result["seconds"] < 2 and result["grown"] < 200 << 20, result


def _planted(truth, directory: Path) -> None:
    """The intact entry with bytes per token 9999, block size 64 and every selection's
    impl swapped, with a valid checksum: the worst another user could plant."""
    _, intact, entry_name = truth

    def evil(data):
        data["table"]["outcomes"] = [
            (row[0], row[1], "dsv4sel.kernels.flashinfer:DeepseekV4FlashInferMLASparseImpl", *row[3:6], 9999, 64,
             *row[8:]) if row[0] == "select" else row for row in data["table"]["outcomes"]]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / entry_name).write_bytes(forged(intact, evil))
    (directory / entry_name).chmod(0o600)


def test_a_planted_entry_is_served_when_the_user_wrote_it_so_the_test_can_fail(truth, tmp_path):
    # the control: an entry of the user's own, in a private directory, is trusted
    directory = tmp_path / "own"
    directory.mkdir(mode=0o700)
    _planted(truth, directory)
    assert child(directory)["answers"][0][2:4] == [9999, 64]


@pytest.mark.parametrize("where", ["world-writable directory", "group-writable directory", "world-writable entry",
                                   "symlinked entry", "symlinked directory", "entry of another user",
                                   "directory of another user"])
def test_an_entry_another_user_could_have_planted_is_never_served(truth, tmp_path, where):
    answers = truth[0]
    directory = tmp_path / "cache"
    if where in ("entry of another user", "directory of another user") and os.geteuid() != 0:
        pytest.skip("making a file of another user needs root")
    if where == "symlinked directory":
        _planted(truth, tmp_path / "elsewhere")
        (tmp_path / "elsewhere").chmod(0o700)
        directory.symlink_to(tmp_path / "elsewhere")
    elif where == "symlinked entry":
        directory.mkdir(mode=0o700)
        _planted(truth, tmp_path / "elsewhere")
        (directory / truth[2]).symlink_to(tmp_path / "elsewhere" / truth[2])
    else:
        directory.mkdir(mode=0o700)
        _planted(truth, directory)
        if where == "world-writable directory":
            directory.chmod(0o777)
        elif where == "group-writable directory":
            directory.chmod(0o770)
        elif where == "world-writable entry":
            (directory / truth[2]).chmod(0o666)
        elif where == "entry of another user":
            os.chown(directory / truth[2], 65534, 65534)
        elif where == "directory of another user":
            os.chown(directory, 65534, 65534)
    assert child(directory)["answers"] == answers


def test_a_missing_cache_directory_is_created_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        directory = tmp_path / "made" / "cache" / "dsv4sel"  # ~/.cache/dsv4sel where ~/.cache is missing
        child(directory)
    finally:
        os.umask(old)
    # its parents too (os.makedirs made them 0777 under umask 000)
    for made in (directory, directory.parent, directory.parent.parent):
        assert made.stat().st_mode & 0o777 == 0o700, made


#: In a child: compile the shipped rules (the packaged artifact out of the way) and stop for good
#: between writing the cache entry's temporary file and renaming it into place.
STALLED_WRITER = textwrap.dedent("""
    import os, sys, time
    import dsv4sel
    from dsv4sel import api
    from dsv4sel.engine import cache
    api.SHIPPED_ARTIFACT = os.devnull + ".none"

    def stall(*args, **kwargs):
        print("written", flush=True)
        time.sleep(600)

    cache.os.replace = stall
    dsv4sel.select(platform="cuda", capability="9.0")
""")


def _temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_a_writer_killed_mid_write_leaves_nothing_for_good(tmp_path):
    directory = tmp_path / "cache"
    env = {**os.environ, "DSV4SEL_CACHE_DIR": str(directory)}
    env.pop("DSV4SEL_NO_CACHE", None)
    writer = subprocess.Popen([sys.executable, "-c", STALLED_WRITER], stdout=subprocess.PIPE, text=True, env=env,
                              cwd=REPO)
    try:
        assert writer.stdout.readline().strip() == "written"
        (left,) = _temporaries(directory)
        assert left.startswith(".") and f".{writer.pid}." in left
    finally:
        writer.kill()  # SIGKILL: no handler, no finally, no cleanup of its own
        writer.wait(timeout=30)
    # what the next run may not touch: a live writer's fresh temporary file (this process's
    # pid), files that only look like one, and a temporary file of another user
    live = f".{left.split('.')[1]}.{os.getpid()}.0123abcd.tmp"
    foreign = {"notes.tmp": b"mine", f".{left.split('.')[1]}.1.tmp": b"not the pattern", ".x.12.0123abcd.tmp": b"x"}
    (directory / live).write_bytes(b"being written")
    for name, data in foreign.items():
        (directory / name).write_bytes(data)
    old_but_live = f".{left.split('.')[1]}.{os.getpid()}.4567cdef.tmp"
    (directory / old_but_live).write_bytes(b"stuck for hours")
    hours_ago = time.time() - cache.STALE_SECONDS - 60
    os.utime(directory / old_but_live, (hours_ago, hours_ago))
    others = f".{left.split('.')[1]}.1.89abcdef.tmp"  # pid 1 runs, so only its owner can make it stale
    (directory / others).write_bytes(b"another user's")
    if os.geteuid() == 0:
        os.chown(directory / others, 65534, 65534)
        os.utime(directory / others, (hours_ago, hours_ago))
    assert child(directory)["compiled"]  # the next run compiles and writes the entry...
    # ...and has removed the killed writer's file and the one stale by age, nothing else
    assert _temporaries(directory) == sorted([live, others, *foreign]), _temporaries(directory)
    assert len(list(directory.glob("*" + cache.SUFFIX))) == 1


def test_pruning_touches_only_entries_it_wrote_and_future_mtimes_force_no_recompile(truth, tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    foreign = {"notes.dsv4c": b"mine", "0000000a.marshal": b"old", "abcdef01.dsv4c": b"not an entry"}
    for n, data in foreign.items():
        (directory / n).write_bytes(data)
    future = time.time() + 365 * 86400
    for i in range(20):  # planted entries of the right name and magic, dated a year ahead
        p = directory / f"{i:08x}{cache.SUFFIX}"
        p.write_bytes(cache.encode({"x": i}))
        os.utime(p, (future, future))
    first = child(directory)
    assert first["compiled"]
    second = child(directory)
    assert not second["compiled"], "the fresh entry was pruned, so every start compiles"
    for n, data in foreign.items():
        assert (directory / n).read_bytes() == data, n
    assert len(list(directory.glob("*" + cache.SUFFIX))) <= 16 + len([n for n in foreign if n.endswith(cache.SUFFIX)])


# ------------------------------------------------------------ installed packs

#: The rule file of the installed pack these tests make: a backend no default rule uses, so the
#: pack changes no decision (a pack directory without rule files is refused: DSV306).
PACK_RULES = Path(REPO, "examples", "mistakes", "clean", "my.yaml")


def _distribution(site: Path, dist: str, entry_points: str, init: str = "", package: str = "rt") -> None:
    (site / package / "rules").mkdir(parents=True, exist_ok=True)
    (site / package / "__init__.py").write_text(init)
    (site / package / "rules" / "__init__.py").write_text(init)
    (site / package / "rules" / "my.yaml").write_bytes(PACK_RULES.read_bytes())
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


PACK_INITS = {
    "raises": "raise RuntimeError('pack __init__ ran')\n",
    "exits 0": "import sys\nsys.exit(0)\n",
    "process": "raise KeyboardInterrupt\n",
}


@pytest.mark.parametrize("init", PACK_INITS)
def test_discovering_an_installed_pack_runs_none_of_its_code(tmp_path, init):
    site = tmp_path / "site"
    _distribution(site, "rtpack", "[dsv4sel.rules]\nrt = rt.rules\n", PACK_INITS[init])
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "import dsv4sel\nfrom dsv4sel.engine import sources\n"
            "(p,) = [p for p in sources.installed_packs() if p.name == 'rt']\n"
            "print(p.path.endswith('rt/rules'), p.impl_modules, 'rt' in sys.modules,\n"
            "      dsv4sel.select(platform='cuda', capability='9.0').backend)")
    proc = subprocess.run([sys.executable, "-c", code, str(site)], capture_output=True, text=True, timeout=60,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "('rt',)", "False", "FLASHMLA_SPARSE_DSV4"]


def test_an_impl_module_that_exits_at_import_is_one_error_not_the_end_of_the_process(tmp_path, monkeypatch):
    from dsv4sel.dsv4.profile import PROFILE
    from dsv4sel.engine.values import load_impl_class
    from dsv4sel.errors import ImplLoadError

    (tmp_path / "exiter.py").write_text("import sys\nsys.exit(0)\n")
    (tmp_path / "interrupter.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("exiter", "interrupter"):
        with pytest.raises(ImplLoadError, match=f"cannot import {module}: (SystemExit|KeyboardInterrupt)"):
            load_impl_class(f"{module}:X", (module,), PROFILE.impl_base)


def test_a_real_interrupt_while_importing_an_impl_is_never_the_impl_s_error(tmp_path, monkeypatch):
    # the user's Ctrl-C (dsv4sel.process.Interrupted, what the command's SIGINT raises) and the
    # machine's memory end the command; once `check` turned them into a DSV406 finding
    from dsv4sel.dsv4.profile import PROFILE
    from dsv4sel.engine.values import load_impl_class
    from dsv4sel.process import Interrupted

    (tmp_path / "ctrl_c.py").write_text("from dsv4sel.process import Interrupted\nraise Interrupted\n")
    (tmp_path / "no_memory.py").write_text("raise MemoryError\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(Interrupted):
        load_impl_class("ctrl_c:X", ("ctrl_c",), PROFILE.impl_base)
    with pytest.raises(MemoryError):
        load_impl_class("no_memory:X", ("no_memory",), PROFILE.impl_base)


BROKEN_PACKS = {
    "a standard-library package": (["[dsv4sel.rules]\nj = json\n"],
                                   "json is a standard-library module; a pack's rules live in the pack's own package"),
    "dsv4sel itself": (["[dsv4sel.rules]\nd = dsv4sel.rules\n"], "dsv4sel is dsv4sel itself"),
    "a package that is not there": (["[dsv4sel.rules]\nghost = nothere.rules\n"],
                                    "entry point ghost = nothere.rules: package not found"),
    "one name, two distributions": (["[dsv4sel.rules]\nrt = rt.rules\n", "[dsv4sel.rules]\nrt = rt.rules\n"],
                                    "entry point 'rt' of group dsv4sel.rules is declared by"),
    "not a package name": (["[dsv4sel.rules]\nbad = ../../etc\n"], "not a dotted package name"),
    # once silently no pack at all, which the docs promised DSV101 for
    "not INI": (["[dsv4sel.rules]\nrt rt.rules\n"],  # `=` forgotten
                "this entry_points.txt mentions dsv4sel.rules but is not valid INI (a line that is neither a "
                "[section] header nor name = value), so the rule packs it declares cannot be read; reinstall "
                "the distribution or fix the file"),
}


def test_an_installed_pack_without_rule_files_is_refused_at_its_directory(tmp_path, monkeypatch):
    # a wheel built without its YAML (package data forgotten): once silently an empty pack
    site = tmp_path / "site"
    _distribution(site, "rtpack", "[dsv4sel.rules]\nrt = rt.rules\n")
    (site / "rt" / "rules" / "my.yaml").unlink()
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(dsv4sel.RuleError) as info:
        dsv4sel.load_rules(use_cache=False)
    (problem,) = info.value.problems
    assert (problem.code, problem.file, problem.line) == ("DSV306", str(site / "rt" / "rules"), 1), str(problem)
    assert [f.code for f in dsv4sel.verify().findings] == ["DSV306"], "check gives what select() gives"


@pytest.mark.parametrize("case", BROKEN_PACKS)
def test_a_declaration_that_cannot_be_a_pack_is_one_located_error(tmp_path, monkeypatch, case):
    texts, message = BROKEN_PACKS[case]
    site = tmp_path / "site"
    for i, text in enumerate(texts):
        _distribution(site, f"dist{i}", "\n# a comment\n" + text)
    monkeypatch.syspath_prepend(str(site))
    before = set(dsv4sel.DEFAULT_ALLOWED_IMPL_MODULES)
    with pytest.raises(dsv4sel.RuleError) as info:
        dsv4sel.load_rules(use_cache=False)
    (problem,) = info.value.problems
    assert message in problem.message
    assert problem.file.endswith("-1.0.dist-info/entry_points.txt") and problem.line == 4, str(problem)
    _, _, allowed = dsv4sel.api.resolve(None)
    assert set(allowed) == before, "a broken declaration widened the allow-list"
    report = dsv4sel.verify()
    assert [f.code for f in report.findings] == ["DSV101"], "check gives what select() gives"


# ------------------------------------------------------------- query strings

QUERIES = {
    "٩.٠": "not a capability spelling", "９.０": "not a capability spelling",
    "9.0\u00a0": "not a capability spelling", "9.0\u2028": "not a capability spelling",
    "9.0\r\n": "not a capability spelling", "H1\x0000": "not a capability spelling",
    "H100 MI300X": "names 2 GPUs at once, H100 (9.0) and MI300X (gfx942): give one",
    "H100 A100": "names 2 GPUs at once, H100 (9.0) and A100 (8.0): give one",
    "x" * 10_000_000: "(10,000,000 characters) is not a capability spelling",
    "H100 " * 200_000: "is not a capability spelling", "sm_9\u0660": "not a capability spelling",
}


@pytest.mark.parametrize("capability", QUERIES, ids=lambda c: ascii(c[:12]))
def test_a_hostile_capability_string_is_refused_quickly(capability):
    with CpuTimer() as timer, pytest.raises(dsv4sel.InvalidQuery, match=".*" + re.escape(QUERIES[capability])):
        dsv4sel.select(platform="cuda", capability=capability)
    assert timer.seconds < 0.5


def test_one_gpu_name_and_the_documented_spellings_still_decide():
    for capability in ("H100", "NVIDIA H100 80GB HBM3", " 9.0 ", "sm_90a", "(9, 0)", "90"):
        assert dsv4sel.select(platform="cuda", capability=capability).backend == "FLASHMLA_SPARSE_DSV4"


def test_a_huge_unknown_value_of_any_input_is_refused_without_matching_it():
    with CpuTimer() as timer, pytest.raises(dsv4sel.InvalidQuery, match=r"\(10,000,000 characters\)"):
        dsv4sel.select(platform="cuda", capability="9.0", kv_cache_dtype="y" * 10_000_000)
    assert timer.seconds < 0.5


# ------------------------------------------------------------- smaller points

class _Hostile(str):
    """A config value whose comparisons raise, as a broken config type's might."""

    def __ne__(self, other):
        raise RuntimeError("no comparing")

    __eq__ = __ne__
    __hash__ = str.__hash__


def test_apply_leaves_the_config_unchanged_when_a_comparison_raises():
    sel = dsv4sel.select(platform="cuda", capability="9.0")  # decided for auto; rewrites cache_dtype
    old = _Hostile("auto")

    class Config:
        cache_dtype = old

    config = Config()
    changed = sel.apply(config)
    assert config.cache_dtype == "fp8_ds_mla" and changed == {"cache_dtype": old}

    class Failing:
        def __init__(self):
            object.__setattr__(self, "cache_dtype", old)

        def __setattr__(self, name, value):
            object.__setattr__(self, name, value)
            raise RuntimeError("stored, then raised")

    failing = Failing()
    with pytest.raises(RuntimeError, match="stored, then raised"):
        sel.apply(failing)
    assert failing.__dict__["cache_dtype"] is old

    # a value that is no string at all is not the `auto` this selection was decided for
    class Odd:
        cache_dtype = object()

    odd = Odd()
    with pytest.raises(dsv4sel.SelectionError, match="its cache_dtype is an object, not a kv_cache_dtype string"):
        sel.apply(odd)
    assert odd.cache_dtype is Odd.cache_dtype


def test_explain_only_rules_without_rules_is_a_usage_error_as_in_check():
    from _cli import run

    result = run("explain", "--platform", "cuda", "--only-rules")
    assert result.rc == 2 and "--only-rules needs at least one --rules PATH" in result.err
    assert run("check", "--only-rules").rc == 2


DOCTOR_WITH_A_PACK = ("doctor", "--platform", "cuda", "--capability", "12.0", "--rules", "examples/mistakes/clean",
                      "--json")


@pytest.fixture(scope="module")
def doctor_first(tmp_path_factory):
    """doctor's first run with a pack: its answer, and the cache directory it filled."""
    from _cli import environ, run

    directory = tmp_path_factory.mktemp("doctor-first") / "cache"
    directory.mkdir(mode=0o700)
    return run(*DOCTOR_WITH_A_PACK, env=environ(DSV4SEL_CACHE_DIR=str(directory))), directory


@pytest.mark.parametrize("digest", [12345, None, ["f" * 64], "z" * 64])
def test_doctor_on_a_cached_digest_of_the_wrong_type_answers_as_documented(tmp_path, digest, doctor_first):
    # issue 17 point 9: doctor exited 3. The user's own entry for a pack's rule set, its digest
    # forged with a valid checksum: doctor recompiles, reports the real digest, exits as
    # documented (0 the auto choice can run, 1 it cannot: no CUDA kernel runs on this CPU host)
    import shutil

    from _cli import environ, run

    first, filled = doctor_first
    directory = tmp_path / "cache"
    shutil.copytree(filled, directory)  # the first run's entries, each case forging its own copy
    env = environ(DSV4SEL_CACHE_DIR=str(directory))
    args = DOCTOR_WITH_A_PACK
    (entry,) = directory.glob("*" + cache.SUFFIX)
    decoded = cache.decode(entry.read_bytes())
    assert type(decoded.data["digest"]) is str
    decoded.data["digest"] = digest
    entry.write_bytes(cache.encode(decoded.data, bytes(decoded.blob)))
    entry.chmod(0o600)
    again = run(*args, env=env)
    assert again.rc == first.rc and again.rc in (0, 1), again
    assert "internal error" not in again.err
    reported = json.loads(again.out)["machine"]["rules_digest"]
    assert reported == json.loads(first.out)["machine"]["rules_digest"] and len(reported) == 64
    assert cache.decode(entry.read_bytes()).data["digest"] == reported  # the forged entry was replaced
    text = run(*args[:-1], env=env)
    assert text.rc == first.rc and f"rules {reported[:12]}" in text.out
