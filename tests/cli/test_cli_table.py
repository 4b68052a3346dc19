"""`dsv4sel table`: the support matrix generated from the rules, and its staleness check."""

from __future__ import annotations

import json

import pytest

import dsv4sel
from dsv4sel.dsv4.selection import Query, Selection

from _cli import REPO, run

DOCS = REPO / "docs" / "backends.md"


@pytest.fixture(scope="module")
def matrix():
    r = run("table", "--format", "json")
    assert r.rc == 0, r
    return json.loads(r.out)


@pytest.fixture(scope="module")
def rules():
    return dsv4sel.load_rules()


def test_the_committed_docs_are_fresh():
    r = run("table", "--format", "md", "--check", str(DOCS))
    assert r.rc == 0, r.out
    assert "is up to date with the rules" in r.out
    assert run("table").out == DOCS.read_text()


def test_a_stale_file_fails_the_check_with_a_diff_and_the_fix(tmp_path):
    stale = tmp_path / "backends.md"
    text = DOCS.read_text()
    edited = text.replace("| 584 |", "| 576 |", 1)
    assert edited != text
    stale.write_text(edited)
    r = run("table", "--check", str(stale))
    assert r.rc == 1, r
    assert f"{stale} is stale: it differs from what the rules generate" in r.out
    assert f"dsv4sel table --format md > {stale}" in r.out
    assert any(line.startswith("-") and "| 576 |" in line for line in r.out.splitlines())
    assert any(line.startswith("+") and "| 584 |" in line for line in r.out.splitlines())


def test_a_missing_file_fails_the_check(tmp_path):
    r = run("table", "--check", str(tmp_path / "nope.md"))
    assert r.rc == 1 and "does not exist" in r.out


def test_the_json_check_compares_json(tmp_path):
    fresh = tmp_path / "backends.json"
    fresh.write_text(run("table", "--format", "json").out)
    assert run("table", "--format", "json", "--check", str(fresh)).rc == 0
    assert run("table", "--format", "md", "--check", str(fresh)).rc == 1


def test_markdown_compresses_capability_families():
    md = DOCS.read_text()
    flashmla = [line for line in md.splitlines() if line.startswith("| `FLASHMLA_SPARSE_DSV4` |")]
    # the Needs column (pack-declared inputs) is empty for FlashMLA: no input but the kv dtype matters
    assert any("| cuda | 9.x, 10.x |  | auto, fp8, fp8_e4m3, fp8_ds_mla | fp8_ds_mla |" in line for line in flashmla), \
        flashmla
    assert "| `CPU_V4_MLA_SPARSE` | cpu | any |" in md


def test_every_row_is_what_select_says_and_every_selection_has_a_row(matrix, rules):
    """The table is exact: each (row, capability, kv dtype) selects that
    backend with that cache, "default" is what a query without a backend
    picks, and every explicit selection anywhere in the space is in a row."""
    covered = set()
    for row in matrix["rows"]:
        extra = dict(row["condition"]) or None
        for cap in row["capabilities"]:
            for kv in row["kv_cache_dtypes"]:
                sel = dsv4sel.select(platform=row["platform"], capability=cap, backend=row["backend"],
                                     kv_cache_dtype=kv, model=row["model"], rules=rules, **(extra or {}))
                assert (sel.backend, sel.layout, sel.torch_dtype_name, sel.bytes_per_token, sel.block_size,
                        sel.impl) == (row["backend"], row["layout"], row["torch_dtype"], row["bytes_per_token"],
                                      row["block_size"], row["impl"]), (row, cap, kv)
                if row["cache_dtype"] == "as requested":
                    assert sel.cache_dtype == kv
                elif " -> " in row["cache_dtype"]:  # a row whose kv dtypes map to different strings
                    mapping = dict(pair.split(" -> ") for pair in row["cache_dtype"].split(", "))
                    assert sel.cache_dtype == mapping[kv]
                else:
                    assert sel.cache_dtype == row["cache_dtype"]
                query, _ = rules.normalize(platform=row["platform"], capability=cap, kv_cache_dtype=kv,
                                           model=row["model"], extra=extra)
                default = rules.outcome(Query(query.model, query.platform, query.capability, None, kv,
                                              query.extra))
                is_default = isinstance(default, Selection) and default.backend == row["backend"]
                expected = row["default"] == "yes" or (row["default"].startswith("with ")
                                                       and kv in row["default"][5:].split(", "))
                assert is_default == expected, (row, cap, kv)
                combos = [query.extra] if row["condition"] else None
                covered.add((row["model"], row["platform"], cap, row["backend"], kv, tuple(combos or ())))
    # completeness: every explicit selection of a backend by itself appears in some row
    for key, index in rules.items():
        model, platform, cap, backend, kv, *extra = key
        out = rules.rows[index]
        if backend is None or out.kind != "select" or out.backend != backend:
            continue
        extra_t = tuple(zip(rules.extra_inputs, extra))
        assert ((model, platform, cap, backend, kv, ()) in covered
                or (model, platform, cap, backend, kv, (extra_t,)) in covered), key


def test_unsupported_capabilities_really_select_nothing(matrix, rules):
    from dsv4sel.tools.probe import extra_combos

    assert matrix["unsupported"], "the shipped rules leave old CUDA capabilities unsupported"
    for u in matrix["unsupported"]:
        for cap in u["capabilities"]:
            point = {"model": u["model"], "platform": u["platform"]}
            for extra in extra_combos(rules):
                if not all(rules.declared_at(name, value, point) for name, value in extra):
                    continue  # not an input of the space (a value declared for another model)
                for backend in (None, *rules.selectable_backends):
                    for kv in rules.values("kv_cache_dtype"):
                        query, _ = rules.normalize(platform=u["platform"], capability=cap, backend=backend,
                                                   kv_cache_dtype=kv, model=u["model"], extra=dict(extra))
                        assert not isinstance(rules.outcome(query), Selection), query


def test_bad_format_is_a_usage_error_naming_the_choices():
    r = run("table", "--format", "xml")
    assert r.rc == 2 and "invalid choice: 'xml'" in r.err and "'md'" in r.err and "'json'" in r.err
