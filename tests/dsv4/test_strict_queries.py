"""Queries are strict: every accepted capability spelling has one meaning,
anything else is an InvalidQuery naming valid spellings, the memo never makes
an answer depend on what was asked before, and apply() is all or nothing."""

from __future__ import annotations

import enum

import pytest

import dsv4sel
from dsv4sel import InvalidQuery, select

from _cli import run


@pytest.mark.parametrize("given,canonical", [
    ("9.0", "9.0"), ("9", "9.0"), ("90", "9.0"), ("sm90", "9.0"), ("sm_90", "9.0"), ("sm_90a", "9.0"),
    ("compute_90", "9.0"), ((9, 0), "9.0"), ("(9, 0)", "9.0"), (" 9.0 ", "9.0"),
    ("10", "10.0"), ("100", "10.0"), ("sm_100a", "10.0"), ("103", "10.3"), ("12", "12.0"), ("120", "12.0"),
    ("121", "12.1"), ("86", "8.6"), ("8.6", "8.6"),
    ("H100", "9.0"), ("h200", "9.0"), ("NVIDIA H100 80GB HBM3", "9.0"), ("B200", "10.0"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0"), ("RTX 5090", "12.0"),
    ("unknown", "unknown"), (None, "unknown"),
])
def test_accepted_cuda_spellings(given, canonical):
    query, _notes = dsv4sel.default_rules().normalize(platform="cuda", capability=given)
    assert query.capability == canonical


@pytest.mark.parametrize("given,canonical", [
    ("gfx942", "gfx942"), ("gfx942:sramecc+:xnack-", "gfx942"), ("MI300X", "gfx942"),
    ("AMD Instinct MI300X", "gfx942"), ("MI355X", "gfx950"), (None, "unknown"),
])
def test_accepted_rocm_spellings(given, canonical):
    query, _notes = dsv4sel.default_rules().normalize(platform="rocm", capability=given)
    assert query.capability == canonical


@pytest.mark.parametrize("given,needle,suggestions", [
    ("9,0", "'9,0' is not a cuda capability; did you mean '9.0'?", ("--capability 9.0",)),
    ("sm90x", "'sm90x' is not a cuda capability.", ()),
    ("H2000", "'H2000' is not a cuda capability", None),
    ("", "'' is not a cuda capability", ()),
    ("12.5", "cuda capability '12.5' is not declared in the rule vocabulary", ("--capability unknown",)),
    (9.0, "9.0 is not a cuda capability", None),
    ((9.0, 0), "(9.0, 0) is not a cuda capability", ()),
    ((True, 0), "(True, 0) is not a cuda capability", ()),
    ([9, 0], "[9, 0] is not a cuda capability", ()),
])
def test_refused_spellings_name_the_valid_ones(given, needle, suggestions):
    with pytest.raises(InvalidQuery) as info:
        select(platform="cuda", capability=given)
    assert needle in str(info.value)
    assert "Declared cuda capabilities: 7.0," in str(info.value)
    if suggestions is not None:
        assert info.value.suggestions == suggestions


def test_a_capability_on_a_platform_without_capabilities_is_refused():
    with pytest.raises(InvalidQuery, match="'9.0' is a CUDA capability: use --platform cuda"):
        select(platform="cpu", capability="9.0")
    with pytest.raises(InvalidQuery, match="cpu capability '13.0' is not declared"):
        select(platform="cpu", capability="13.0")  # declared nowhere: no platform to name


@pytest.mark.parametrize("platform, given, message, other", [
    ("cuda", "MI300X", "MI300X is a ROCm GPU (gfx942): use --platform rocm", "rocm"),
    ("cuda", "AMD Instinct MI355X", "AMD Instinct MI355X is a ROCm GPU (gfx950): use --platform rocm", "rocm"),
    ("rocm", "H100", "H100 is a CUDA GPU (9.0): use --platform cuda", "cuda"),
    ("cuda", "gfx942", "'gfx942' is a ROCm capability: use --platform rocm", "rocm"),
    ("rocm", "sm_90", "'sm_90' is a CUDA capability (9.0): use --platform cuda", "cuda"),
])
def test_a_capability_of_another_platform_names_that_platform(platform, given, message, other):
    with pytest.raises(InvalidQuery) as info:
        select(platform=platform, capability=given)
    assert info.value.reason == message and info.value.suggestions == (f"--platform {other}",)


@pytest.mark.parametrize("given, platform", [
    ("H100", "cuda"), ("NVIDIA H100 80GB HBM3", "cuda"), ("RTX PRO 6000", "cuda"), ("9.0", "cuda"), ((9, 0), "cuda"),
    ("MI300X", "rocm"), ("gfx942:sramecc+:xnack-", "rocm"),
    ("unknown", None), ("H1OO", None), ("13.0", None), ("H100 MI300X", None),
])
def test_the_platform_a_capability_names(given, platform):
    assert dsv4sel.default_rules().capability_platform(given) == platform


def test_the_cli_refuses_a_misspelt_capability_with_exit_2():
    for spelling in ("9,0", "sm9O", "H1OO"):
        r = run("explain", "--platform", "cuda", "--capability", spelling)
        assert r.rc == 2, r
        assert "is not a cuda capability" in r.err and "Write it as '9.0'" in r.err, r


def test_capability_12_on_flashinfer_gets_the_sm12x_layout_not_sm10x_rows():
    # vLLM #47783: SM10x rows on an SM120 card produced garbage
    r = run("explain", "--platform", "cuda", "--capability", "12", "--attention-backend",
            "FLASHINFER_MLA_SPARSE_DSV4", "--kv-cache-dtype", "fp8", "--json")
    assert r.rc == 0, r
    import json

    sel = json.loads(r.out)["selection"]
    assert sel["layout"] == "fp8_ds_mla" and json.loads(r.out)["query"]["capability"] == "12.0"


def test_answers_do_not_depend_on_what_was_asked_before():
    rules = dsv4sel.load_rules()
    for _ in range(2):
        with pytest.raises(InvalidQuery):
            select(rules=rules, platform="cuda", capability=(9.0, 0))
        assert select(rules=rules, platform="cuda", capability=(9, 0)).backend == "FLASHMLA_SPARSE_DSV4"
    with pytest.raises(InvalidQuery):
        select(rules=rules, platform="cuda", capability=(True, 0))
    assert select(rules=rules, platform="cuda", capability=(1 + 8, 0)).query.capability == "9.0"


def test_an_enum_backend_is_read_by_name_and_memoized_apart_from_strings():
    class Backend(str, enum.Enum):  # a str enum: equal to its value, which is not its name
        FLASHMLA_SPARSE_DSV4 = "FLASHINFER_MLA_SPARSE_DSV4"

    rules = dsv4sel.load_rules()
    by_enum = select(rules=rules, platform="cuda", capability="10.0", backend=Backend.FLASHMLA_SPARSE_DSV4)
    by_value = select(rules=rules, platform="cuda", capability="10.0", backend="FLASHINFER_MLA_SPARSE_DSV4")
    assert (by_enum.backend, by_value.backend) == ("FLASHMLA_SPARSE_DSV4", "FLASHINFER_MLA_SPARSE_DSV4")
    again = select(rules=rules, platform="cuda", capability="10.0", backend=Backend.FLASHMLA_SPARSE_DSV4)
    assert again.backend == "FLASHMLA_SPARSE_DSV4"


class Config:
    def __init__(self, **values):
        self.__dict__.update(values)


class StoresThenRaises(Config):
    """A config whose validating setter stores the value first, then refuses it."""

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        if name == "cache_dtype" and value == "fp8_ds_mla":
            raise ValueError("validator refuses fp8_ds_mla after storing it")


def test_apply_restores_a_value_that_a_failing_setter_stored():
    sel = select(platform="cuda", capability="9.0", kv_cache_dtype="auto")
    assert dict(sel.rewrites) == {"cache_dtype": "fp8_ds_mla"}
    config = StoresThenRaises(cache_dtype="auto")
    with pytest.raises(ValueError, match="validator refuses"):
        sel.apply(config)
    assert config.cache_dtype == "auto"


def test_apply_changes_nothing_when_an_attribute_is_missing():
    sel = select(platform="cuda", capability="9.0", kv_cache_dtype="auto")
    with pytest.raises(AttributeError, match="has no attribute 'cache_dtype'"):
        sel.apply(Config(block_size=16))
    config = Config(cache_dtype="auto")
    assert sel.apply(config) == {"cache_dtype": "auto"} and config.cache_dtype == "fp8_ds_mla"


def test_an_input_value_declared_for_another_model_is_an_invalid_query():
    # prefill_context_parallel is declared per model: only DeepSeek-V4.1 has "on"
    with pytest.raises(InvalidQuery, match="prefill_context_parallel 'on' is not declared for model "
                                           "'deepseek_v4'; there it is one of: off"):
        select(platform="cuda", capability="10.0", prefill_context_parallel="on")
    sel = select(platform="cuda", capability="10.0", model="deepseek_v4_1", prefill_context_parallel="on")
    assert sel.backend == "FLASHMLA_SPARSE_DSV41"
