"""The KV wire contract of a decision (dsv4sel.dsv4.contract) and the KV memory of N tokens
(dsv4sel.dsv4.kvmemory): what a process that reads another's KV bytes relies on."""

from __future__ import annotations

import hashlib
import json
import pickle

import pytest

import dsv4sel
from dsv4sel.dsv4.contract import KVContract
from dsv4sel.dsv4.kvmemory import GEOMETRIES, kv_memory, parse_layers
from dsv4sel.record import FrozenError

V41 = dict(model="deepseek_v4_1", platform="cuda")


def pools(contract: KVContract) -> dict:
    return {p.name: (p.record, p.bytes_per_token, p.arrangement, p.fp8) for p in contract.pools}


def test_the_fingerprint_is_sha256_of_the_documented_canonical_serialization():
    # pinned: a fingerprint another machine, Python or dsv4sel release computes must be this one
    contract = dsv4sel.select(platform="cuda", capability="9.0").contract
    text = contract.canonical()
    assert text == ('{"block_size":256,"engine":null,"model":"deepseek_v4","pools":[{"arrangement":"block-split",'
                    '"bytes_per_token":584,"encoding":"448 fp8 e4m3 NoPE + 64 bf16 RoPE, 7 UE8M0 scales (one per '
                    '64 NoPE values) + 1 pad byte","fp8":"ocp","name":"main","record":"fp8_ds_mla"},{"arrangement":'
                    '"block-split","bytes_per_token":584,"encoding":"448 fp8 e4m3 NoPE + 64 bf16 RoPE, 7 UE8M0 '
                    'scales (one per 64 NoPE values) + 1 pad byte","fp8":"ocp","name":"compressed","record":'
                    '"fp8_ds_mla"}],"release":null,"version":1}')
    assert contract.fingerprint == "kv1-" + hashlib.sha256(text.encode()).hexdigest()[:16] == "kv1-4ce0a9e02d0d2664"


def test_the_contract_is_frozen_pickles_and_is_in_the_selection_s_dict():
    sel = dsv4sel.select(platform="cuda", capability="10.0", kv_cache_dtype="fp8")
    contract = sel.contract
    with pytest.raises(FrozenError):
        contract.block_size = 64  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(contract)) == contract
    assert sel.as_dict()["contract"] == contract.as_dict() == json.loads(json.dumps(contract.as_dict()))
    assert list(contract.fields())[:5] == ["model", "engine", "release", "block_size", "main.record"]


def test_the_cache_dtype_string_is_not_part_of_it():
    # FlashInfer's rows keep vLLM's string, fp8 or fp8_e4m3: the same bytes (fleet.md row 6)
    a = dsv4sel.select(platform="cuda", capability="10.0", backend="FLASHINFER_MLA_SPARSE_DSV4", kv_cache_dtype="fp8")
    b = dsv4sel.select(platform="cuda", capability="10.0", backend="FLASHINFER_MLA_SPARSE_DSV4",
                       kv_cache_dtype="fp8_e4m3")
    assert a.cache_dtype != b.cache_dtype and a.contract == b.contract
    assert pools(a.contract)["main"] == ("fp8_e4m3_row", 512, "row", "ocp")


def test_v41_on_sm90_and_sm100_differ_in_the_record_though_the_cache_dtype_string_is_the_same():
    hopper = dsv4sel.select(capability="9.0", **V41)
    blackwell = dsv4sel.select(capability="10.0", backend="FLASHMLA_SPARSE_DSV41", **V41)
    assert hopper.cache_dtype == blackwell.cache_dtype == "fp8_ds_mla"
    assert pools(hopper.contract)["main"] == ("fp8_ds_mla", 584, "block-split", "ocp")
    assert pools(blackwell.contract)["main"] == ("fp8_ds_mla_v41", 528, "token-interleaved", "ocp")
    assert (hopper.contract.block_size, blackwell.contract.block_size) == (64, 128)


def test_mega_attention_s_compressed_pool_is_nvfp4():
    sel = dsv4sel.select(capability="10.0", mega_attn="available", **V41)
    assert pools(sel.contract) == {"main": ("fp8_ds_mla_v41", 528, "token-interleaved", "ocp"),
                                   "compressed": ("nvfp4_ds_mla", 288, "token-interleaved", "ocp")}


def test_gfx942_is_fnuz_where_each_engine_reads_fnuz():
    sel = dsv4sel.select(platform="rocm", capability="gfx942")
    # vLLM: the sliding-window cache FNUZ, the compressed cache OCP on every platform
    assert [p.fp8 for p in sel.contract.pools] == ["fnuz", "ocp"]
    assert [p.fp8 for p in sel.contract_for("vllm", "0.33.0").pools] == ["fnuz", "ocp"]
    # SGLang's HIP backend reads its whole cache as e4m3fnuz
    assert [p.fp8 for p in sel.contract_for("sglang", "0.5.23").pools] == ["fnuz", "fnuz"]
    assert [p.fp8 for p in dsv4sel.select(platform="rocm", capability="gfx950").contract.pools] == ["ocp", "ocp"]
    assert [p.fp8 for p in dsv4sel.select(platform="rocm").contract.pools] == ["unknown", "ocp"]
    assert dsv4sel.select(platform="cuda", capability="9.0").contract != sel.contract


def test_bf16_rows_hold_no_fp8():
    sel = dsv4sel.select(platform="cuda", capability="10.0", backend="FLASHINFER_MLA_SPARSE_DSV4")
    assert pools(sel.contract)["main"] == ("bf16_row", 1024, "row", "none")


def test_sglang_s_pools_follow_its_kv_layout_setting():
    sel = dsv4sel.select(capability="10.0", mega_attn="available", **V41)
    assert sel.settings_for("sglang")["kv_layout"] == "v41"
    sglang = sel.contract_for("sglang", "0.5.23")
    # SGLang's default V4.1 layout is block-split, vLLM 0.33's record interleaved: same sizes, other bytes
    assert pools(sglang) == {"main": ("fp8_ds_mla_v41", 528, "block-split", "ocp"),
                             "compressed": ("nvfp4_ds_mla", 288, "block-split", "ocp")}
    assert sglang.block_size == 256 and (sglang.engine, sglang.release) == ("sglang", "0.5.23")
    new = sel.contract_for("sglang", "0.5.23", {**sel.settings_for("sglang"), "kv_layout": "v41_new"})
    assert pools(new)["main"] == ("fp8_ds_mla_v41", 528, "token-interleaved", "ocp")
    assert sel.contract_for("vllm", "0.33.0").fingerprint not in {sglang.fingerprint, sel.contract.fingerprint}


# ------------------------------------------------------------------ KV memory for N tokens

def test_memory_is_window_plus_compressed_entries_plus_indexer_rows_per_layer():
    contract = dsv4sel.select(platform="cuda", capability="9.0").contract  # 584-byte records
    geometry = parse_layers("swa=1,c4=2,c128=3,window=128", "deepseek_v4")
    memory = kv_memory(contract, 1000, geometry)
    per_layer = {use.kind.name: use.per_layer for use in memory.layers}
    assert per_layer == {"swa": 128 * 584,
                         "c4": 128 * 584 + 250 * 584 + 250 * 132,
                         "c128": 128 * 584 + 8 * 584}  # ceil(1000 / 128) = 8
    assert memory.total == per_layer["swa"] + 2 * per_layer["c4"] + 3 * per_layer["c128"]
    # fewer tokens than the window: the window holds them all
    assert kv_memory(contract, 100, geometry).layers[0].per_layer == 100 * 584


def test_the_model_s_default_layers_are_deepseek_v4_flash_s_and_other_models_must_name_theirs():
    flash = GEOMETRIES["deepseek_v4"]
    assert (flash.layers, flash.window, [(k.name, k.count) for k in flash.kinds]) == (
        43, 128, [("swa", 2), ("c4", 21), ("c128", 20)])
    assert "deepseek_v4_1" not in GEOMETRIES
    v41 = parse_layers("c1=4,c2=4,swa=1,window=64", "deepseek_v4_1")
    assert [(k.name, k.ratio, k.indexer) for k in v41.kinds] == [("swa", 0, False), ("c1", 1, False),
                                                                 ("c2", 2, False)]


@pytest.mark.parametrize(("spec", "says"), [
    ("swa=2,c4=21", "give the sliding window too"),
    ("swa=2,c5=1,window=128", "'c5=1' is not KEY=COUNT with a known key; the keys for deepseek_v4 are swa, c4, c128"),
    ("swa=2,swa=3,window=128", "'swa=3' is given twice"),
    ("swa=x,window=128", "swa='x' is not a whole number"),
    ("swa=0,window=128", "every count is 0"),
    ("swa=1,window=0", "window='0' is not a positive number"),
])
def test_a_bad_layer_spec_is_one_error_naming_the_fix(spec, says):
    with pytest.raises(ValueError, match="--layers") as exc:
        parse_layers(spec, "deepseek_v4")
    assert says in str(exc.value)
