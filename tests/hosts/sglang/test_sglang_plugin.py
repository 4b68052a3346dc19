"""The SGLang plugin fails closed (no SGLang needed: stand-in ``sglang`` modules, as SGLang's own
loader would see a broken install). SGLang swallows exceptions raised while a plugin registers, so
whatever goes wrong reading the host must end in the refusing hook, never in SGLang deciding alone;
and an input outside SGLang's space, or a scheduler handed a decision it cannot read, is one clear
refusal."""
from __future__ import annotations

import importlib.metadata
import json
import sys
import types

import pytest

from dsv4sel import SelectionError
from dsv4sel import sglang_plugin as plugin
from dsv4sel.sglang_plugin import scheduler
from dsv4sel.sglang_plugin.translation import translation


def _fake_sglang(monkeypatch, *, metadata_version, module_version):
    """An SGLang whose distribution metadata and ``sglang.version`` say what the test says
    (an exception class: reading it raises that); returns the hooks it registered."""
    hooks: dict = {}
    mods = {name: types.ModuleType(name) for name in (
        "sglang", "sglang.version", "sglang.srt", "sglang.srt.arg_groups", "sglang.srt.arg_groups.resolution_hooks")}

    def register_resolution_hook(step):
        def add(fn):
            hooks[step] = fn
            return fn
        return add

    mods["sglang.srt.arg_groups.resolution_hooks"].register_resolution_hook = register_resolution_hook
    if module_version is not ImportError:
        mods["sglang.version"].__version__ = module_version
    else:
        del mods["sglang.version"]
        monkeypatch.delitem(sys.modules, "sglang.version", raising=False)
    for name, module in mods.items():
        monkeypatch.setitem(sys.modules, name, module)
    real = importlib.metadata.version

    def version(dist):
        if dist != "sglang":
            return real(dist)
        if isinstance(metadata_version, type):
            raise metadata_version(dist)
        return metadata_version
    monkeypatch.setattr(importlib.metadata, "version", version)
    return hooks


@pytest.mark.parametrize("metadata_version,module_version,why", [
    (importlib.metadata.PackageNotFoundError, "0.5.23", "version cannot be read (PackageNotFoundError"),
    ("0.5.23", ImportError, "version cannot be read (ModuleNotFoundError"),
    ("not a version", "not a version", "'not a version', which is not a PEP 440 version"),
    ("0.5.24", "0.5.24", "this is sglang 0.5.24"),
], ids=["no distribution metadata", "no sglang.version", "unparsable version", "another release"])
def test_a_host_the_plugin_cannot_read_gets_only_the_refusing_hook(monkeypatch, metadata_version, module_version, why):
    hooks = _fake_sglang(monkeypatch, metadata_version=metadata_version, module_version=module_version)
    plugin.register()  # must not raise: SGLang would log it and decide alone
    assert list(hooks) == [plugin.STEP]
    with pytest.raises(plugin.PluginError) as info:
        hooks[plugin.STEP](object(), lambda args: None)
    assert why in str(info.value) and "SGLANG_PLUGINS=dsv4sel" in str(info.value)


POINT = {"model": "deepseek_v4", "platform": "cuda", "capability": "9.0", "dsv4_attn_backend": "auto",
         "kv_cache_dtype": "auto", "kv_layout_env": "unset", "deployment": "single"}


@pytest.mark.parametrize("name,value,says", [
    ("dsv4_attn_backend", "flashmla_typo", "dsv4_attn_backend 'flashmla_typo' is not one dsv4sel decides for; "
                                           "did you mean 'flashmla'?"),
    ("kv_cache_dtype", "fp8_e4m2", "kv_cache_dtype 'fp8_e4m2' is not one dsv4sel decides for; did you mean "),
    ("capability", "7.0", "capability '7.0' is not one dsv4sel decides for on cuda"),
])
def test_an_sglang_input_outside_the_translation_is_one_refusal(name, value, says):
    t = translation()
    t.check_point(POINT)  # inside the space: passes
    with pytest.raises(SelectionError) as info:
        t.check_point({**POINT, name: value})
    assert says in str(info.value) and t.file in str(info.value)


@pytest.mark.parametrize("text", ["{not json", "[]", json.dumps({"class": "x"}), json.dumps(
    {"class": 1, "kv_layout": "v4", "rule": "r", "location": "l", "contract": "c"}), json.dumps(
    {"class": "a:B", "kv_layout": "v4", "rule": "r", "location": "l"})])
def test_a_scheduler_handed_an_unreadable_decision_refuses(monkeypatch, text):
    monkeypatch.setenv(scheduler.DECISION_ENV, text)
    with pytest.raises(SelectionError, match=f"{scheduler.DECISION_ENV} is not a decision dsv4sel published"):
        scheduler.check_backend(object())


def test_a_published_decision_is_read_back(monkeypatch):
    monkeypatch.delenv(scheduler.DECISION_ENV, raising=False)
    assert scheduler.published() is None
    scheduler.publish("a.b:C", {"kv_layout": "v4"}, "r", "rules/x.yaml:3", "dsv4sel contract kv1-0 model=m")
    assert scheduler.published() == {"class": "a.b:C", "kv_layout": "v4", "rule": "r", "location": "rules/x.yaml:3",
                                     "contract": "dsv4sel contract kv1-0 model=m"}
    scheduler.forget()


@pytest.mark.parametrize("mode,want", [(None, "none"), ("null", "none"), ("prefill", "prefill"), ("decode", "decode"),
                                       ("both", SelectionError), (["prefill"], SelectionError)])
def test_the_role_under_disaggregation_is_read_from_the_mode_or_refused(monkeypatch, mode, want):
    # SGLang's resolving view of its server args, as the plugin reads it (the real SGLang: tests/sglang523)
    module = types.ModuleType("sglang.srt.arg_groups.model_override_base")
    module.resolving_view = lambda args: args
    for name in ("sglang", "sglang.srt", "sglang.srt.arg_groups"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    args = types.SimpleNamespace(disaggregation_mode=mode)
    if want is SelectionError:
        with pytest.raises(SelectionError, match=r"--disaggregation-mode .* is not one the dsv4sel plugin knows "
                                                 r"\(null, prefill, decode\)"):
            plugin.role(args)
    else:
        assert plugin.role(args) == want
