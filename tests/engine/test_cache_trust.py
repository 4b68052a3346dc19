"""The compiled cache can be trusted, or is not used.

A cache entry is untrusted input: damaged bytes, a hand edit, a stale entry
for edited rules, a poisoned installed-pack list or a full disk must never
change a decision, crash a later select() or widen the impl allow-list.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
from pathlib import Path

import pytest

import dsv4sel
from dsv4sel.dsv4.profile import PROFILE  # noqa: E402
from dsv4sel.engine import cache, sources
from dsv4sel.engine.ruleset import CorruptTable
from dsv4sel.dsv4.rules import RuleSet

from _repo import REPO as _REPO

REPO = Path(_REPO)

#: Queries whose answers every trial checks (a select, a rewrite, a rejection).
PROBES = [
    dict(platform="cuda", capability="9.0", kv_cache_dtype="auto"),
    dict(platform="cuda", capability="12.0", kv_cache_dtype="fp8"),
    dict(platform="rocm", capability="gfx942", kv_cache_dtype="fp8_ds_mla"),
    dict(platform="cuda", capability="9.0", kv_cache_dtype="bfloat16"),
]
FLIPS = 600


def answers(rules: RuleSet) -> list:
    out = []
    for query in PROBES:
        try:
            sel = dsv4sel.select(rules=rules, **query)
            out.append((sel.backend, sel.impl, sel.layout, sel.cache_dtype, dict(sel.rewrites), sel.rule.id))
        except dsv4sel.SelectionError as exc:
            out.append(("rejected", str(exc)))
    return out


@pytest.fixture(scope="module")
def truth():
    """The shipped rules compiled without any cache, and their answers."""
    rules = dsv4sel.load_rules(use_cache=False)
    return rules, answers(rules)


@pytest.fixture(autouse=True)
def _no_packaged_artifact(monkeypatch, tmp_path_factory):
    """These tests are about the user cache: the packaged artifact, which the
    shipped rules alone would read first, is out of the way."""
    from dsv4sel import api

    monkeypatch.setattr(api, "SHIPPED_ARTIFACT", str(tmp_path_factory.mktemp("no-artifact") / "none.dsv4c"))


def the_entry() -> Path:
    (path,) = list(Path(cache.cache_dir()).glob("*" + cache.SUFFIX))
    return path


def undetected_flips(raw: bytes, decode, seed: int) -> list[int]:
    """The offsets of ``FLIPS`` random one-byte flips of ``raw`` that ``decode`` still accepts."""
    rng = random.Random(seed)
    missed = []
    for _ in range(FLIPS):
        i = rng.randrange(len(raw))
        flipped = bytearray(raw)
        flipped[i] ^= rng.randrange(1, 256)
        if decode(bytes(flipped)) is not None:
            missed.append(i)
    return missed


def test_every_single_byte_flip_of_an_entry_is_detected(truth):
    dsv4sel.load_rules()
    raw = the_entry().read_bytes()
    missed = undetected_flips(raw, cache.decode, seed=20261201)
    assert missed == [], f"{len(missed)} of {FLIPS} flips were not detected"


def test_a_damaged_entry_is_rebuilt_and_every_later_select_is_right(truth):
    rules, expected = truth
    dsv4sel.load_rules()
    path = the_entry()
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    rebuilt = dsv4sel.load_rules()
    assert answers(rebuilt) == expected
    assert cache.decode(path.read_bytes()) is not None, "the damaged entry was replaced"


def test_a_damaged_packaged_artifact_is_never_served(tmp_path):
    """The package's compiled form is read without the per-row checks (they ran on these bytes
    when they were written): every damaged byte must stop it at the CRC instead."""
    from dsv4sel import api

    srcs, allowed = sources.shipped_sources(), tuple(dsv4sel.DEFAULT_ALLOWED_IMPL_MODULES)
    artifact = Path(api.write_shipped_artifact(str(tmp_path / "shipped.dsv4c")))
    raw = artifact.read_bytes()
    assert cache.read_packaged(str(artifact)) is not None
    fingerprint = sources.fingerprint_bytes(srcs, allowed, api._domain_files())
    assert api._from_entry(cache.decode_packaged(raw), fingerprint, allowed, verified=True) is not None
    entry = cache.decode_packaged(raw)  # the same value, types included, as the JSON form decodes to
    assert repr(cache.decode(cache.encode(entry.data, bytes(entry.blob))).data) == repr(entry.data)
    missed = undetected_flips(raw, cache.decode_packaged, seed=20261205)
    assert missed == [], f"{len(missed)} of {FLIPS} flips were not detected"


def test_the_packaged_form_is_never_read_from_the_user_cache(truth, monkeypatch):
    """marshal allocates what its bytes claim: the user cache is JSON only, and an entry
    there in the package's form is refused and rebuilt, never unmarshalled."""
    rules, expected = truth
    dsv4sel.load_rules()
    path = the_entry()
    entry = cache.decode(path.read_bytes())
    path.write_bytes(cache.encode(entry.data, bytes(entry.blob), packaged=True))

    def never(raw):
        raise AssertionError("the user cache was read as the packaged form")
    monkeypatch.setattr(cache, "decode_packaged", never)
    assert answers(dsv4sel.load_rules()) == expected
    assert cache.decode(path.read_bytes()) is not None, "the entry was replaced by a JSON one"


def _rewritten(path: Path, edit) -> None:
    """Apply ``edit`` to the decoded entry and store it with a valid checksum,
    as someone who knows the format would."""
    entry = cache.decode(path.read_bytes())
    edit(entry.data)
    path.write_bytes(cache.encode(entry.data, bytes(entry.blob)))


def test_a_hand_edited_impl_is_neither_named_nor_imported(truth, monkeypatch):
    rules, expected = truth
    dsv4sel.load_rules()

    def poison(data):
        table = data["table"]
        table["outcomes"] = [(row[0], row[1], "this:Zen", *row[3:]) if row[0] == "select" else row
                             for row in table["outcomes"]]
        table["allowed"] = ("this",)  # the allow-list in the entry is ignored: it comes from the process
    _rewritten(the_entry(), poison)
    loaded = dsv4sel.load_rules()
    assert answers(loaded) == expected
    assert "this" not in loaded.allowed_impl_modules
    sel = dsv4sel.select(rules=loaded, platform="cuda", capability="9.0")
    assert sel.impl.startswith("dsv4sel.kernels.")


@pytest.fixture(scope="module")
def fresh_table():
    from dsv4sel.engine.build import build_program

    from dsv4sel.engine.lower import to_table

    return to_table(build_program(sources.shipped_sources(), dsv4sel.DEFAULT_ALLOWED_IMPL_MODULES, PROFILE))


@pytest.mark.parametrize("damage", [
    "outcomes truncated", "ids too short", "id out of range", "row of wrong types", "format from the future",
    "path to a missing rule", "impl outside the allow-list", "compiled for another key order",
    "compiled for other select fields",
])
def test_a_structurally_broken_table_is_refused_by_the_rule_set(fresh_table, damage):
    import copy

    table = copy.deepcopy(fresh_table)
    RuleSet(copy.deepcopy(table), "digest", dsv4sel.DEFAULT_ALLOWED_IMPL_MODULES)  # intact: accepted
    outcomes = table["outcomes"]
    select_at = next(i for i, row in enumerate(outcomes) if row[0] == "select")
    if damage == "outcomes truncated":
        table["outcomes"] = outcomes[:1]
    elif damage == "ids too short":
        table["table"]["ids"] = table["table"]["ids"][:-2]
    elif damage == "id out of range":
        ids = bytearray(table["table"]["ids"])
        ids[0:2] = (60000).to_bytes(2, "little")
        table["table"]["ids"] = bytes(ids)
    elif damage == "row of wrong types":
        row = outcomes[select_at]
        outcomes[select_at] = (*row[:6], "584", *row[7:])
    elif damage == "format from the future":
        table["format"] = 99
    elif damage == "path to a missing rule":
        outcomes[select_at] = (*outcomes[select_at][:-1], (10**6,))
    elif damage == "impl outside the allow-list":
        outcomes[select_at] = (*outcomes[select_at][:2], "os:system", *outcomes[select_at][3:])
    elif damage == "compiled for another key order":
        table["key"] = tuple(reversed(table["key"]))
    elif damage == "compiled for other select fields":
        table["fields"] = (*table["fields"][:2], table["fields"][3], table["fields"][2], *table["fields"][4:])
    with pytest.raises(CorruptTable):
        RuleSet(table, "digest", dsv4sel.DEFAULT_ALLOWED_IMPL_MODULES)


def test_an_edit_that_keeps_size_and_mtime_is_seen(tmp_path):
    pack = tmp_path / "rules"
    shutil.copytree(REPO / "rules", pack, ignore=shutil.ignore_patterns("compat"))
    target = pack / "flashmla.yaml"
    before = dsv4sel.load_rules(paths=[str(pack)])
    sel = dsv4sel.select(rules=before, platform="cuda", capability="9.0", kv_cache_dtype="fp8")
    old_text = target.read_text()
    info = os.stat(target)
    new_text = old_text.replace("block_size: 256", "block_size: 128", 1)
    assert new_text != old_text and len(new_text) == len(old_text)
    target.write_text(new_text)
    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))  # as `touch -d`, `cp -p`, `rsync -a` do
    assert os.stat(target).st_size == info.st_size and os.stat(target).st_mtime_ns == info.st_mtime_ns
    after = dsv4sel.load_rules(paths=[str(pack)])
    assert sel.block_size == 256
    assert dsv4sel.select(rules=after, platform="cuda", capability="9.0", kv_cache_dtype="fp8").block_size == 128


@pytest.mark.parametrize("failure", ["write", "rename"])
def test_a_full_disk_leaves_no_temporary_file(tmp_path, monkeypatch, failure):
    monkeypatch.setenv("DSV4SEL_CACHE_DIR", str(tmp_path / "cache"))
    if failure == "rename":
        def replace(*_args):
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(cache.os, "replace", replace)
    else:  # every write fails as on a full disk: the temporary file's descriptor is /dev/full
        real_open = os.open

        def open_(path, flags, *args, **kwargs):
            fd = real_open(path, flags, *args, **kwargs)
            if flags & os.O_CREAT:
                os.close(fd)
                return real_open("/dev/full", os.O_WRONLY)
            return fd
        monkeypatch.setattr(cache.os, "open", open_)
    rules = dsv4sel.load_rules()
    assert dsv4sel.select(rules=rules, platform="cuda", capability="9.0").backend == "FLASHMLA_SPARSE_DSV4"
    left = sorted(p.name for p in (tmp_path / "cache").iterdir()) if (tmp_path / "cache").exists() else []
    assert not [n for n in left if n.endswith(".tmp")], left


@pytest.fixture
def installed_pack(tmp_path, monkeypatch):
    """A distribution on sys.path that declares the rule pack ``extra``."""

    site = tmp_path / "site"
    (site / "extrapack" / "rules").mkdir(parents=True)
    (site / "extrapack" / "__init__.py").write_text("")
    (site / "extrapack" / "rules" / "__init__.py").write_text("")
    info = site / "extrapack-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: extrapack\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[dsv4sel.rules]\nextra = extrapack.rules\n")
    monkeypatch.syspath_prepend(str(site))
    return site


def test_an_installed_pack_allows_its_own_package(installed_pack):
    (pack,) = [p for p in sources.installed_packs() if p.name == "extra"]
    assert pack.impl_modules == ("extrapack",)
    assert pack.path == str(installed_pack / "extrapack" / "rules")


def test_an_edited_pack_declaration_is_seen_without_any_mtime_changing(installed_pack):
    assert [p.name for p in sources.installed_packs() if p.name in ("extra", "other")] == ["extra"]
    entry_points = installed_pack / "extrapack-1.0.dist-info" / "entry_points.txt"
    stamp = os.stat(entry_points)
    directory = os.stat(installed_pack)
    entry_points.write_text("[dsv4sel.rules]\nother = extrapack.rules\n")  # same size
    os.utime(entry_points, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    os.utime(installed_pack, ns=(directory.st_atime_ns, directory.st_mtime_ns))
    assert [p.name for p in sources.installed_packs() if p.name in ("extra", "other")] == ["other"]


def test_every_engine_module_and_the_profile_key_the_cache(tmp_path, monkeypatch):
    # an edit of any module that shapes the compiled form (lower.py, artifact.py, ...) or of the
    # profile must make a cached table stale, not only the five files once named
    from dsv4sel import api
    from dsv4sel.engine import lower

    engine_dir = Path(lower.__file__).parent
    read = set(sources.compiler_files()) | set(api._domain_files())
    for module in engine_dir.glob("*.py"):
        assert str(module) in read, module.name
    assert PROFILE.schema in read
    srcs = sources.shipped_sources()
    before = sources.fingerprint(srcs, (), api._domain_files())
    copy = tmp_path / "lower.py"
    copy.write_bytes(Path(lower.__file__).read_bytes() + b"\n# edited\n")
    monkeypatch.setattr(sources, "compiler_files",
                        lambda: tuple(str(copy) if p.endswith("lower.py") else p for p in
                                      (str(m) for m in sorted(engine_dir.glob("*.py")))))
    assert sources.fingerprint(srcs, (), api._domain_files()) != before
