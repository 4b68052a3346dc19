"""The vLLM plugin's handshake and start-up checks on their own (no vLLM needed): the targets patched when
vLLM imports their module (:mod:`dsv4sel.vllm_plugin.later`), the contract in NIXL's compatibility hash
(:mod:`dsv4sel.vllm_plugin.handshake`) and the ranks' refusals (:mod:`dsv4sel.vllm_plugin.ranks`). The
same code against vLLM's own functions: ``tests/hosts/fleet/test_fleet_engines.py``."""
from __future__ import annotations

import dataclasses
import importlib
import sys
import types

import pytest

import dsv4sel
from dsv4sel import SelectionError
from dsv4sel import vllm_plugin as plugin
from dsv4sel.dsv4.contract import wire_fields
from dsv4sel.vllm_plugin import handshake, later, ranks
from dsv4sel.vllm_plugin.state import _state

PROBE = '''
def compute_nixl_compatibility_hash(vllm_config, attn_backend_name, transfer_mode="pull"):
    return "digest-of-" + str(vllm_config.cache_config.cache_dtype)


class EngineCore:
    def _initialize_kv_caches(self, vllm_config):
        return "vllm's own"


def get_global_kv_cache_groups(vllm_config, kv_cache_specs):
    return "vllm's own"
'''
#: the release folders' targets, on a probe package written at test time
TARGETS = (("probe_pkg.nixl", "compute_nixl_compatibility_hash", ("vllm_config", "attn_backend_name", "transfer_mode"),
            "nixl_hash"),
           ("probe_pkg.core", "EngineCore._initialize_kv_caches", ("self", "vllm_config"), "rank_contracts"),
           ("probe_pkg.core", "get_global_kv_cache_groups", ("vllm_config", "kv_cache_specs"), "rank_specs"))


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """A package whose modules hold the targets' shapes, importable and not imported."""
    package = tmp_path / "probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nixl.py").write_text(PROBE)
    (package / "core.py").write_text(PROBE)
    (package / "never.py").write_text(PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    later.forget()
    for name in [n for n in sys.modules if n.startswith("probe_pkg")]:
        del sys.modules[name]
    _state["selection"] = _state["ranks"] = None


def test_a_target_is_patched_when_its_module_is_imported_and_put_back_by_forget(probe):
    core = importlib.import_module("probe_pkg.core")  # imported before: patched at once
    later.watch(TARGETS, "0.33.0", plugin._expect)
    assert "probe_pkg.nixl" not in sys.modules  # never imported by the plugin
    assert core.get_global_kv_cache_groups.__wrapped_vllm__ is not None
    nixl = importlib.import_module("probe_pkg.nixl")  # imported by "vLLM": patched before anyone reads it
    assert nixl.compute_nixl_compatibility_hash.__wrapped_vllm__ is not None
    assert len(later.patched()) == 3
    later.forget()
    assert not hasattr(core.get_global_kv_cache_groups, "__wrapped_vllm__")
    assert not hasattr(core.EngineCore._initialize_kv_caches, "__wrapped_vllm__")
    assert not hasattr(nixl.compute_nixl_compatibility_hash, "__wrapped_vllm__")
    assert not any(isinstance(f, later._Finder) for f in sys.meta_path)


def test_a_changed_target_refuses_at_its_import_and_patches_nothing_of_that_module(probe):
    (probe / "core.py").write_text(PROBE.replace("(vllm_config, kv_cache_specs)", "(vllm_config, specs, extra)"))
    later.watch(TARGETS, "0.33.0", plugin._expect)
    with pytest.raises(plugin.PluginError, match=r"expected probe_pkg\.core\.get_global_kv_cache_groups\("
                                                 r"vllm_config, kv_cache_specs\) on vllm 0\.33\.0, found "
                                                 r"\(vllm_config, specs, extra\)"):
        importlib.import_module("probe_pkg.core")
    assert later.patched() == []


def test_a_changed_target_already_imported_refuses_before_anything_is_replaced(probe):
    (probe / "core.py").write_text(PROBE.replace("def _initialize_kv_caches(self, vllm_config)",
                                                 "def _initialize_kv_caches(self)"))
    core = importlib.import_module("probe_pkg.core")
    with pytest.raises(plugin.PluginError, match="EngineCore._initialize_kv_caches"):
        later.watch(TARGETS, "0.33.0", plugin._expect)
    assert later.patched() == [] and not hasattr(core.get_global_kv_cache_groups, "__wrapped_vllm__")


def _view_config(cache_dtype: str):
    return types.SimpleNamespace(cache_config=types.SimpleNamespace(cache_dtype=cache_dtype))


def _hash(selection, cache_dtype: str) -> str:
    _state["selection"] = selection
    try:
        return handshake.make_nixl_hash(lambda cfg, name, transfer_mode="pull": f"{name}:{cfg.cache_config.cache_dtype}")(
            _view_config(cache_dtype), "DEEPSEEK_SPARSE_SWA")
    finally:
        _state["selection"] = None


def _select(**query):
    return dsv4sel.select(platform="cuda", **query)


def test_the_nixl_hash_carries_the_contract_not_the_cache_dtype_spelling(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.33.0"))
    fi = {"capability": "10.0", "backend": "FLASHINFER_MLA_SPARSE_DSV4"}
    spelt_fp8 = _hash(_select(kv_cache_dtype="fp8", **fi), "fp8")
    spelt_e4m3 = _hash(_select(kv_cache_dtype="fp8_e4m3", **fi), "fp8_e4m3")
    assert spelt_fp8 == spelt_e4m3  # the same rows: equal hashes (vLLM's own differ)
    assert "fp8_e4m3:" not in spelt_fp8 and ":dsv4sel contract" in spelt_fp8  # vLLM hashed the contract
    hopper = _hash(_select(capability="9.0", model="deepseek_v4_1"), "fp8_ds_mla")
    blackwell = _hash(_select(capability="10.0", model="deepseek_v4_1", backend="FLASHMLA_SPARSE_DSV41"), "fp8_ds_mla")
    assert hopper != blackwell  # 584-byte UE8M0 against 528-byte MXFP8: vLLM's own hashes are equal
    fields = wire_fields(blackwell)
    assert (fields["main.record"], fields["block_size"], fields["engine"], fields["release"]) == (
        "fp8_ds_mla_v41", "128", "vllm", "0.33.0")
    # a worker with no dsv4sel decision (another model): vLLM's own hash
    assert _hash(None, "auto") == "DEEPSEEK_SPARSE_SWA:auto"


def _decision(**query) -> dict:
    _state["selection"] = _select(**query)
    try:
        return ranks.worker_decision(types.SimpleNamespace(rank=0))
    finally:
        _state["selection"] = None


def test_ranks_that_decided_one_contract_pass_and_others_are_one_named_refusal(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.33.0"))
    hopper = _decision(capability="9.0", kv_cache_dtype="fp8")
    rtx = _decision(capability="12.0", kv_cache_dtype="fp8")  # another class, the same record
    flashinfer = _decision(capability="10.0", backend="FLASHINFER_MLA_SPARSE_DSV4", kv_cache_dtype="fp8")
    assert ranks.contracts_refusal([hopper, rtx, hopper]) is None
    refusal = ranks.contracts_refusal([hopper, hopper, flashinfer, None, {"fingerprint": "kv9-x"}])
    assert refusal is not None
    assert "  rank 2 against ranks 0, 1: main.record fp8_e4m3_row against fp8_ds_mla; main.bytes_per_token 512 " \
           "against 584;" in refusal
    assert "  ranks 0, 1 (cuda 9.0: FLASHMLA_SPARSE_DSV4 by flashmla-fp8 (rules/flashmla.yaml:" in refusal
    assert "  rank 2 (cuda 10.0: FLASHINFER_MLA_SPARSE_DSV4 by flashinfer-sm10x-fp8 (rules/flashinfer.yaml:" in refusal
    assert "  rank 3: no dsv4sel decision: vLLM decided alone there" in refusal
    assert "  rank 4: an answer this dsv4sel cannot read (another dsv4sel release" in refusal


@dataclasses.dataclass(frozen=True)
class Spec:
    block_size: int
    cache_dtype_str: str


def test_workers_whose_specs_differ_are_one_refusal_naming_the_layer_the_fields_and_the_rules():
    decisions = [{"device": "cuda 9.0", "backend": "A", "rule": "a (rules/a.yaml:3)", "contract": {}, "fingerprint": "f"},
                 None]
    specs = [{"layers.0": Spec(256, "fp8_ds_mla"), "layers.1": Spec(256, "fp8_ds_mla")},
             {"layers.0": Spec(256, "fp8"), "layers.1": Spec(64, "fp8")}]
    assert ranks.specs_refusal([specs[0], specs[0]], decisions) is None
    refusal = ranks.specs_refusal(specs, decisions)
    assert refusal is not None and refusal.startswith(
        "DeepSeek-V4 KV cache: rank 1 builds another KV cache spec than rank 0 for layer layers.0 (and 1 more "
        "layers): cache_dtype_str 'fp8' against 'fp8_ds_mla'\n  rank 0 (cuda 9.0: A by a (rules/a.yaml:3))\n"
        "  rank 1 (no dsv4sel decision")


def test_the_engine_core_checks_only_deepseek_v4_and_refuses_before_vllm_plans(monkeypatch):
    monkeypatch.setattr(ranks, "model_of", lambda cfg: cfg)
    calls: list = []
    own = ranks.make_initialize_kv_caches(lambda self, cfg: calls.append(cfg) or "planned")

    class Executor:
        def __init__(self, found):
            self.found = found

        def collective_rpc(self, method):
            if isinstance(self.found, Exception):
                raise self.found
            return self.found

    engine = types.SimpleNamespace(model_executor=Executor([None, None]))
    assert own(engine, None) == "planned"  # another model: no question asked of the workers
    with pytest.raises(SelectionError, match="ranks 0, 1: no dsv4sel decision"):
        own(engine, "deepseek_v4")
    engine.model_executor = Executor(RuntimeError("Worker failed with error 'No module named dsv4sel'"))
    with pytest.raises(SelectionError, match=r"cannot read the decision of every worker of this vLLM instance "
                                             r"\(RuntimeError: Worker failed with error 'No module named dsv4sel'\)"):
        own(engine, "deepseek_v4")
    assert calls == [None]
