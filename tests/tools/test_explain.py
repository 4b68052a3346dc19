"""The explanation model (dsv4sel.tools.explain), in process: outcome, path with
file:line, rewrites, why-not per backend, blocked_by, nearest alternatives and
the JSON layout. Locations are derived from the rule files, never hard-coded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dsv4sel
from dsv4sel import InvalidQuery, SelectionError
from dsv4sel.tools.explain import BLOCKED_BY, Explanation, explain
from dsv4sel.record import FrozenError

from _cli import rule_line


@pytest.fixture(scope="module")
def rules():
    return dsv4sel.load_rules()


def loc(file: str, rule_id: str) -> str:
    return f"rules/{file}:{rule_line(file, rule_id)}"


# ------------------------------------------------------------- shipped rules

def test_selection_shows_rewrite_before_after_and_the_default_path(rules):
    ex = explain(rules, platform="cuda", capability="9.0", kv_cache_dtype="auto")
    assert ex.ok and ex.rejection is None
    assert ex.selection == dsv4sel.select(platform="cuda", capability="9.0", rules=rules)
    assert [(r.attribute, r.before, r.after) for r in ex.rewrites] == [("cache_dtype", "auto", "fp8_ds_mla")]
    assert [(s.action, s.table, s.target) for s in ex.path] == [
        ("default", "<default>", "FLASHMLA_SPARSE_DSV4"), ("select", "FLASHMLA_SPARSE_DSV4", None)]
    assert ex.path[0].rule.location == loc("defaults.yaml", "default-cuda-sm9x-sm10x")
    assert ex.rule.location == loc("flashmla.yaml", "flashmla-fp8") == ex.selection.rule.location
    assert "Using DeepSeek's fp8_ds_mla KV cache format." in ex.messages
    assert ex.alternatives == ()


def test_a_canonical_dtype_has_no_rewrite_and_an_explicit_backend_skips_the_default_rule(rules):
    ex = explain(rules, platform="cuda", capability="10.0", kv_cache_dtype="fp8_ds_mla",
                 backend="flashmla_sparse_dsv4")
    assert ex.ok and ex.rewrites == ()
    assert [s.action for s in ex.path] == ["select"]
    assert ex.rule.location == loc("flashmla.yaml", "flashmla-fp8-ds-mla")
    assert ex.selection.is_default is False


def test_a_hand_over_is_a_use_step(rules):
    ex = explain(rules, platform="rocm", capability="gfx942", backend="FLASHMLA_SPARSE_DSV4")
    assert ex.selection.backend == "ROCM_FLASHMLA_SPARSE_DSV4"
    assert [(s.action, s.target) for s in ex.path] == [("use", "ROCM_FLASHMLA_SPARSE_DSV4"), ("select", None)]
    assert ex.path[0].rule.location == loc("flashmla.yaml", "flashmla-on-rocm")
    assert any(m.level == "warning" and "CUDA-only" in m for m in ex.messages)


def test_why_not_gives_the_first_reason_with_its_rule(rules):
    ex = explain(rules, platform="cuda", capability="9.0")
    why = {w.backend: w for w in ex.why_not}
    fi = why["FLASHINFER_MLA_SPARSE_DSV4"]
    assert (fi.verdict, fi.blocked_by, fi.accepts) == ("rejects", "capability", ())
    assert fi.rule.location == loc("flashinfer.yaml", "flashinfer-sm9x")
    with pytest.raises(SelectionError) as info:
        dsv4sel.select(platform="cuda", capability="9.0", backend="FLASHINFER_MLA_SPARSE_DSV4", rules=rules)
    assert fi.reason in str(info.value)
    assert "FLASHMLA_SPARSE_DSV4" not in why  # the selected backend is not a "why not"


def test_why_not_blocked_by_the_kv_dtype_lists_what_it_accepts(rules):
    ex = explain(rules, platform="cuda", capability="10.0", kv_cache_dtype="fp8_ds_mla")
    fi = next(w for w in ex.why_not if w.backend == "FLASHINFER_MLA_SPARSE_DSV4")
    assert (fi.verdict, fi.blocked_by) == ("rejects", "kv_cache_dtype")
    assert {"auto", "bfloat16", "fp8", "fp8_e4m3"} <= set(fi.accepts) and "fp8_ds_mla" not in fi.accepts
    assert fi.rule.location == loc("flashinfer.yaml", "flashinfer-sm10x-unsupported-dtype")


def test_a_backend_that_would_serve_says_why_it_was_not_chosen(rules):
    ex = explain(rules, platform="cuda", capability="10.0")
    fi = next(w for w in ex.why_not if w.backend == "FLASHINFER_MLA_SPARSE_DSV4")
    assert fi.verdict == "would_serve" and fi.blocked_by is None
    assert fi.selection.layout == "bf16_row"
    assert "default-cuda-sm9x-sm10x" in fi.reason and "--attention-backend FLASHINFER_MLA_SPARSE_DSV4" in fi.reason


def test_rejection_has_reason_blocked_by_and_nearest_alternatives(rules):
    ex = explain(rules, platform="cuda", capability="10.0", kv_cache_dtype="bfloat16")
    assert not ex.ok and ex.selection is None
    r = ex.rejection
    assert (r.backend, r.blocked_by, r.gap) == ("FLASHMLA_SPARSE_DSV4", "kv_cache_dtype", False)
    assert r.rule.location == loc("flashmla.yaml", "flashmla-unsupported-dtype")
    first = ex.alternatives[0]
    assert (first.backend, first.kv_cache_dtype, first.changes, first.flags) == (
        None, "auto", ("kv_cache_dtype",), "--kv-cache-dtype auto")
    assert {"fp8", "fp8_e4m3", "fp8_ds_mla"} <= set(first.also)  # same cache, folded in
    keep_dtype = [a for a in ex.alternatives if a.changes == ("backend",)]
    assert [(a.backend, a.kv_cache_dtype, a.selection.layout) for a in keep_dtype] == [
        ("FLASHINFER_MLA_SPARSE_DSV4", "bfloat16", "bf16_row")]
    # the explicit spelling of the default backend with auto stores the same cache: not repeated
    assert not any(a.backend == "FLASHMLA_SPARSE_DSV4" for a in ex.alternatives)


def test_the_error_suggests_what_explain_lists_keeping_the_asked_backend_first(rules):
    query = dict(platform="cuda", capability="10.0", backend="FLASHINFER_MLA_SPARSE_DSV4",
                 kv_cache_dtype="fp8_ds_mla")
    ex = explain(rules, **query)
    with pytest.raises(dsv4sel.SelectionError) as info:
        rules.select(**query)
    assert info.value.suggestions == tuple(a.suggestion for a in ex.alternatives)
    # keeping the backend the operator named is the smaller change: its kv dtypes come first
    assert info.value.suggestions == ("--kv-cache-dtype auto", "--kv-cache-dtype fp8",
                                      "no --attention-backend (picks FLASHMLA_SPARSE_DSV4)")
    assert [a.flags for a in ex.alternatives][-1] == "no --attention-backend"  # explain names it in a column


def test_rejection_keeps_the_messages_of_the_rules_before_it(rules):
    ex = explain(rules, platform="cuda", capability=None, kv_cache_dtype="bfloat16")
    assert not ex.ok
    assert ex.path[0].rule.id == "default-cuda-unknown"
    assert any(m.level == "warning" and "CUDA capability unknown" in m for m in ex.messages)


@pytest.mark.parametrize("kwargs, blocked", [
    (dict(platform="cuda", capability="9.0", backend="TRITON_MLA"), "backend"),
    (dict(platform="cpu", backend="FLASHMLA_SPARSE_DSV4"), "platform"),
    (dict(platform="cuda", capability="8.0"), "capability"),
    (dict(platform="cuda", capability="9.0", kv_cache_dtype="fp8_e5m2"), "kv_cache_dtype"),
])
def test_blocked_by_names_the_input_to_change(rules, kwargs, blocked):
    ex = explain(rules, **kwargs)
    assert ex.rejection.blocked_by == blocked
    assert blocked in BLOCKED_BY


def test_nothing_nearby_means_no_alternatives(rules):
    ex = explain(rules, platform="cuda", capability="8.0")
    assert ex.rejection.backend is None  # the default decision itself rejected
    assert [s.action for s in ex.path] == ["reject"]
    assert ex.alternatives == ()
    assert {w.verdict for w in ex.why_not} == {"rejects"}


def test_typos_raise_invalid_query_naming_the_nearest_value(rules):
    with pytest.raises(InvalidQuery, match="did you mean 'fp8_e4m3'"):
        explain(rules, platform="cuda", kv_cache_dtype="fp8_e4m4")
    with pytest.raises(InvalidQuery, match="did you mean 'FLASHMLA_SPARSE_DSV4'"):
        explain(rules, platform="cuda", backend="FLASHMLA_SPARS_DSV4")


def test_values_are_frozen(rules):
    ex = explain(rules, platform="cuda", capability="9.0")
    with pytest.raises(FrozenError):
        ex.selection_ = None
    with pytest.raises(FrozenError):
        ex.path[0].action = "x"
    assert isinstance(ex, Explanation) and hash(ex.path[0]) == hash(ex.path[0])


TOP_KEYS = ["version", "status", "query", "selection", "rejection", "rule", "path", "rewrites", "messages",
            "why_not", "alternatives", "rules_digest", "contract", "memory"]


def _json(ex) -> dict:
    """The explanation as ``--json`` prints it, read back."""
    from dsv4sel.cli.render.data import document

    return json.loads(document(ex.as_dict()))


def test_json_has_the_documented_keys_in_order(rules):
    ok = _json(explain(rules, platform="cuda", capability="10.0"))
    assert list(ok) == TOP_KEYS and ok["status"] == "selected" and ok["version"] == 1
    assert list(ok["selection"]) == ["backend", "impl", "layout", "cache_dtype", "torch_dtype",
                                     "bytes_per_token", "block_size", "is_default", "hosts"]
    assert list(ok["path"][0]) == ["id", "file", "line", "location", "pack", "path", "table", "action", "target",
                                   "description"]
    assert ok["rewrites"] == [{"attribute": "cache_dtype", "before": "auto", "after": "fp8_ds_mla"}]
    assert list(ok["why_not"][0]) == ["backend", "verdict", "blocked_by", "reason", "rule", "accepts", "selection"]
    assert ok["rejection"] is None and ok["alternatives"] == []
    bad = _json(explain(rules, platform="cuda", capability="10.0", kv_cache_dtype="bfloat16"))
    assert bad["status"] == "rejected" and bad["selection"] is None
    assert list(bad["rejection"]) == ["backend", "reason", "blocked_by", "gap", "message"]
    assert list(bad["alternatives"][0]) == ["backend", "kv_cache_dtype", "also", "changes", "flags",
                                            "selection", "rule"]
    assert bad["rule"]["location"] == loc("flashmla.yaml", "flashmla-unsupported-dtype")


def test_explanations_agree_with_the_evaluator_over_the_space(rules):
    """For every platform, capability and backend (and a spread of kv dtypes):
    explain agrees with the core evaluator; every alternative really selects
    what it claims; the first alternative is a smallest change; alternatives
    give distinct caches; nothing is suggested when nothing nearby works.
    (RuleSet.outcome is the oracle: select() would build suggestions on every
    rejection, which makes this sweep minutes instead of seconds.)"""
    from dsv4sel.dsv4.selection import Selection

    def decide(**kwargs):
        query, notes = rules.normalize(**kwargs)
        return rules.outcome(query, notes)

    kvs = ("auto", "bfloat16", "fp8", "fp8_ds_mla", "fp8_e5m2")
    backends = (None, *rules.selectable_backends, "TRITON_MLA")
    model = rules.default_of("model")
    checked = 0
    for platform in rules.values("platform"):
        for cap in rules.values("capability", platform):
            selecting = [(b, k) for b in (None, *rules.selectable_backends) for k in rules.values("kv_cache_dtype")
                         if isinstance(decide(platform=platform, capability=cap, backend=b, kv_cache_dtype=k,
                                              model=model), Selection)]
            for backend in backends:
                for kv in kvs:
                    point = dict(platform=platform, capability=cap, kv_cache_dtype=kv, model=model)
                    ex = explain(rules, backend=backend, **point)
                    truth = decide(backend=backend, **point)
                    if isinstance(truth, Selection):
                        assert ex.selection == truth
                        continue
                    assert not ex.ok and ex.rejection.reason == truth.reason
                    checked += 1
                    working = [(b != ex.query.backend) + (k != kv) for b, k in selecting]
                    assert bool(ex.alternatives) == bool(working), ex.query
                    if working:
                        assert len(ex.alternatives[0].changes) == min(working), ex.query
                    seen = set()
                    for alt in ex.alternatives:
                        got = decide(platform=platform, capability=cap, backend=alt.backend,
                                     kv_cache_dtype=alt.kv_cache_dtype, model=model)
                        assert got == alt.selection
                        cache = (got.backend, got.layout, got.torch_dtype_name, got.bytes_per_token)
                        assert cache not in seen
                        seen.add(cache)
    assert checked > 100  # the sweep did meet many rejections


# --------------------------------------------------------- purpose-built rules

#: a vocabulary with a pack input (``fast``) and a second model, a default decision with a
#: warning, backend B and backend F (which needs fast=yes): YAML files, read by path
RULES = Path(__file__).with_name("rules") / "explain"


@pytest.fixture
def custom(write_rules):
    return dsv4sel.load_rules([write_rules(RULES)])


def test_a_gap_is_explained_as_a_gap(custom):
    ex = explain(custom, platform="cuda", capability=None, model="m")  # B has no rule for unknown
    assert not ex.ok and ex.rejection.gap and ex.rejection.blocked_by is None
    assert ex.rejection.rule is not None or ex.path  # where the walk stopped is shown
    assert [(s.action, s.target) for s in ex.path] == [("default", "B")]
    assert "gap" in ex.rejection.reason


def test_a_pack_input_can_be_what_blocks(custom):
    ex = explain(custom, platform="cuda", capability="10.0", backend="F", kv_cache_dtype="bfloat16")
    assert ex.rejection.blocked_by == "fast"
    assert ex.rejection.rule.location == "rules/f.yaml:" + str(
        next(i for i, t in enumerate((RULES / "f.yaml").read_text().splitlines(), 1) if "id: f-slow" in t))
    # alternatives keep the machine's inputs: F is not suggested while fast=no
    assert ex.alternatives and all(a.selection.backend == "B" for a in ex.alternatives)
    fast = explain(custom, platform="cuda", capability="10.0", backend="F", kv_cache_dtype="bfloat16",
                   extra={"fast": "yes"})
    assert fast.ok and fast.selection.cache_dtype == "bfloat16"


def test_the_model_can_be_what_blocks(custom):
    ex = explain(custom, platform="cuda", capability="9.0", model="m2", backend="B")
    assert ex.rejection.blocked_by == "model"
    assert ex.rejection.reason == "B serves m only"


def test_default_rule_warnings_survive_a_rejection(custom):
    ex = explain(custom, platform="cuda", capability="9.0", kv_cache_dtype="bfloat16", model="m")
    assert ex.rejection.reason == "B cannot store bfloat16"
    assert [(m.level, str(m)) for m in ex.messages] == [("warning", "w-default on 9.0")]
    assert ex.alternatives[0].flags == "--kv-cache-dtype auto" and ex.alternatives[0].also == ("fp8",)


def test_why_not_lists_only_the_backends_of_the_platform_and_model(custom):
    ex = explain(custom, platform="cuda", capability="9.0", model="m")
    assert [w.backend for w in ex.why_not] == ["F"]  # F serves m on cuda (with fast=yes)
    assert ex.why_not[0].blocked_by == "capability"
    assert explain(custom, platform="cpu", model="m").why_not == ()


# ------------------------------------------------------------- an impl that will not load

def _pack_with_impl(tmp_path: Path, impl: str) -> str:
    """The clean example pack (examples/mistakes/clean), its impl replaced: a one-line edit made
    here so that it follows the example."""
    from _cli import REPO

    clean = (REPO / "examples" / "mistakes" / "clean" / "my.yaml").read_text()
    shipped = "impl: dsv4sel.kernels.reference:DeepseekV4ReferenceSparseImpl"
    assert shipped in clean
    pack = tmp_path / "pack"
    pack.mkdir(parents=True)
    (pack / "my.yaml").write_text(clean.replace(shipped, f"impl: {impl}"))
    return str(pack)


def _impl_warnings(pack: str, allowed=()) -> list[str]:
    rules = dsv4sel.load_rules(extra=[pack], allowed_impl_modules=allowed)
    ex = explain(rules, platform="cuda", capability="12.0", backend="MY_MLA_SPARSE")
    assert ex.ok
    return [str(m) for m in ex.messages if m.level == "warning"]


def test_explain_says_the_selected_impl_names_no_class_of_its_module(tmp_path):
    # issue 32 point 18: a misspelled class gave a clean explain
    impl = "dsv4sel.kernels.reference:DeepseekV4RefrenceSparseImpl"
    assert _impl_warnings(_pack_with_impl(tmp_path, impl)) == [
        f"the impl {impl} cannot be loaded here (dsv4sel.kernels.reference has no class "
        "'DeepseekV4RefrenceSparseImpl'; did you mean 'DeepseekV4ReferenceSparseImpl'?): loading it will fail; "
        "`dsv4sel check` reports this as DSV406"]


def test_explain_says_the_selected_impl_is_no_impl(tmp_path):
    impl = "dsv4sel.kernels.base:Any"  # a name the module imported, not a class it defines
    (warning,) = _impl_warnings(_pack_with_impl(tmp_path, impl))
    assert ("(dsv4sel.kernels.base.Any is the class typing.Any, not an impl: an impl is a subclass of "
            "dsv4sel.kernels.base.SparseMLAImpl)") in warning


def test_explain_says_the_selected_impl_s_module_raises_at_import(tmp_path, monkeypatch):
    # issue 32 point 18: a pack's impl without run_library raises when its module is imported
    src = tmp_path / "src"
    (src / "my_broken_pack").mkdir(parents=True)
    (src / "my_broken_pack" / "__init__.py").write_text(
        "from dsv4sel.kernels.base import SparseMLAImpl\n\n\n"
        "class BrokenImpl(SparseMLAImpl):\n"
        "    @classmethod\n"
        "    def import_library(cls):\n"
        "        raise ImportError('no library here')\n")
    monkeypatch.syspath_prepend(str(src))
    impl = "my_broken_pack:BrokenImpl"
    (warning,) = _impl_warnings(_pack_with_impl(tmp_path, impl), allowed=["my_broken_pack"])
    assert warning.startswith(f"the impl {impl} cannot be loaded here (cannot import my_broken_pack: TypeError: "
                              "BrokenImpl must implement run_library: run_library(self, plan, q, kv_cache, ")
    # the same module with the hook written: a clean explain
    (src / "my_broken_pack" / "__init__.py").write_text(
        (src / "my_broken_pack" / "__init__.py").read_text()
        + "\n    def run_library(self, plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink):\n"
          "        raise NotImplementedError\n")
    assert _impl_warnings(_pack_with_impl(tmp_path / "fixed", impl), allowed=["my_broken_pack"]) == []


def test_explain_says_the_selected_impl_s_module_is_not_there(tmp_path):
    impl = "dsv4sel.kernels.refrence:DeepseekV4ReferenceSparseImpl"
    assert _impl_warnings(_pack_with_impl(tmp_path, impl)) == [
        f"the impl {impl} cannot be loaded here (no module named 'dsv4sel.kernels.refrence'): loading it will "
        "fail; `dsv4sel check` reports this as DSV406"]
