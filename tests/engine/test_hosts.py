"""Host classes (`hosts:`): version specs, compile-time checks, and the vLLM plugin's refusals
(with a stand-in `vllm` module: the real-vLLM tests are tests/hosts/vllm/v0_33/test_differential.py)."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

import dsv4sel
from dsv4sel.engine import hosts
from dsv4sel.errors import RuleError


@pytest.mark.parametrize("version,spec,ok", [
    ("0.33.0", ">=0.33.0,<0.34", True),
    ("0.33.7", ">=0.33.0,<0.34", True),
    ("0.34.0", ">=0.33.0,<0.34", False),
    ("0.32.9", ">=0.33.0,<0.34", False),
    ("0.33.0rc1+cu130", ">=0.33.0,<0.34", True),
    ("0.33.1", "==0.33.*", True),
    ("0.34.1", "==0.33.*", False),
    ("0.33.1", "!=0.33.1", False),
])
def test_version_matches(version, spec, ok):
    assert hosts.version_matches(version, spec) is ok


@pytest.mark.parametrize("spec", ["0.33", ">=0.33,<", "~=0.33", ">=0.33.*"])
def test_bad_version_specs_raise(spec):
    with pytest.raises(ValueError):
        hosts.specifier(spec)


def test_shipped_selections_name_vllm_classes():
    sel = dsv4sel.select(platform="cuda", capability="12.0", kv_cache_dtype="fp8")
    cls, versions = sel.host_class("vllm")
    assert cls == "vllm.models.deepseek_v4.nvidia.flashinfer_sparse:DeepseekV4FlashInferSM120Attention"
    assert versions == ">=0.33.0,<0.35"
    sel10 = dsv4sel.select(platform="cuda", capability="10.0", kv_cache_dtype="auto",
                           backend="FLASHINFER_MLA_SPARSE_DSV4")
    assert sel10.host_class("vllm")[0].endswith(":DeepseekV4FlashInferMLAAttention")
    # SGLang builds the SM12x fp8_ds_mla pages with its FlashMLA backend, told these settings
    assert sel.host_class("sglang") == (
        "sglang.srt.layers.attention.deepseek_v4_backend:DeepseekV4AttnBackend", ">=0.5.23,<0.5.24")
    assert sel.settings_for("sglang") == {"dsv4_attn_backend": "flashmla", "kv_layout": "v4",
                                          "kv_cache_dtype": "fp8_e4m3", "page_size": 256, "kv_pool": "single"}
    # SGLang 0.5.23 cannot build FlashInfer's SM10x bf16 rows: no sglang entry there
    assert sel10.layout == "bf16_row"
    assert sel10.host_class("sglang") is None and sel10.settings_for("sglang") == {}
    assert sel10.settings_for("vllm") == {}


def test_every_shipped_selection_names_a_vllm_class():
    rules = dsv4sel.default_rules()
    rows = [r for r in rules.rows if r.kind == "select"]
    assert rows and all(any(h == "vllm" for h, _, _ in r.hosts) for r in rows)


#: one-rule packs whose `hosts:` is wrong: outside_package/ (a vLLM class in os.path), no_versions/,
#: setting_type/ (a host setting block_size written as a string)
RULES = Path(__file__).with_name("rules") / "hosts"


def test_a_host_class_outside_its_package_is_refused(write_rules):
    with pytest.raises(RuleError) as err:
        dsv4sel.load_rules(paths=[write_rules(RULES / "outside_package")])
    assert [(p.code, str(p.loc)) for p in err.value.problems] == [("DSV306", "rules/x.yaml:1:1"), ("DSV315", "rules/x.yaml:13:21")]  # alone: no vocabulary either, err.value


def test_a_host_setting_that_builds_a_select_field_has_its_type(write_rules):
    # the vLLM plugin hands `block_size` to vLLM's cache config as written: "64" is refused at compile time
    with pytest.raises(RuleError) as err:
        dsv4sel.load_rules(paths=[write_rules(RULES / "setting_type")])
    problem = next(p for p in err.value.problems if p.code == "DSV315")
    assert str(problem.loc) == "rules/x.yaml:13:21" and problem.message == (
        "host vllm setting block_size is '64' (str); it builds the select field block_size, an int: write "
        "block_size: 64"), err.value


def test_hosts_need_class_and_versions(write_rules):
    with pytest.raises(RuleError) as err:
        dsv4sel.load_rules(paths=[write_rules(RULES / "no_versions")])
    assert [(p.code, str(p.loc)) for p in err.value.problems] == [("DSV204", "rules/x.yaml:13:21")], err.value


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


def test_plugin_refuses_another_vllm_version_and_patches_nothing(fake_vllm):
    from dsv4sel import vllm_plugin

    fake_vllm.__version__ = "0.35.0"
    with pytest.raises(vllm_plugin.PluginError, match="written for vllm >=0.33.0,<0.35 and this is vllm 0.35.0"):
        vllm_plugin.install()
    assert vllm_plugin._state["patched"] is None


def test_plugin_entry_point_is_declared():
    import tomllib
    from pathlib import Path

    meta = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["vllm.general_plugins"] == {"dsv4sel": "dsv4sel.vllm_plugin:register"}
    assert any(r.startswith("vllm") for r in meta["project"]["optional-dependencies"]["vllm"])
