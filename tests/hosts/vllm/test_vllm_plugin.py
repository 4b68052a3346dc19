"""The vLLM plugin against broken or changed vLLMs (no vLLM needed: fake ``vllm`` modules).

Issue 17, point 8: ``install()`` raises only :class:`PluginError`, whatever vLLM does wrong,
and patches nothing; ``register()`` (vLLM's entry point) turns that into one log line unless
the user named the plugin in ``VLLM_PLUGINS``. At call time a malformed config value is one
SelectionError, and a host class outside vLLM's DeepSeek-V4 modules is never imported.
"""
from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import pytest

from dsv4sel import SelectionError
from dsv4sel import vllm_plugin as plugin

#: packs as YAML files: evil/ (a vLLM class outside vLLM's DeepSeek-V4 modules), own/ (an impl in the
#: pack's own module)
RULES = Path(__file__).with_name("rules")

TARGETS = {  # module -> (attribute, parameters) of what the plugin replaces on CUDA
    "vllm.models.deepseek_v4.attention": ("_resolve_dsv4_kv_cache_dtype", "a, b, c"),
    "vllm.models.deepseek_v41.attention": ("_resolve_dsv4_kv_cache_dtype", "a, b, c, d"),
    "vllm.models.deepseek_v4.nvidia.model": ("_select_dsv4_attn_cls", "vllm_config"),
    "vllm.models.deepseek_v41.nvidia.model": ("_select_dsv4_attn_cls", "vllm_config"),
}
PARAMS = {"a, b, c": "use_fp8_ds_mla_layout, kv_cache_dtype, cache_config",
          "a, b, c, d": "use_fp8_ds_mla_layout, kv_cache_dtype, cache_config, packed_kv_cache_dtype",
          "vllm_config": "vllm_config"}


def _function(params: str):
    namespace: dict = {}
    exec(f"def f({PARAMS[params]}):\n    return 'vllm'\n", namespace)
    return namespace["f"]


class FakePlatform:
    def is_cuda(self):
        return True

    def is_rocm(self):
        return False

    def is_xpu(self):
        return False

    def is_cpu(self):
        return False

    @classmethod
    def check_and_update_config(cls, vllm_config):
        return None


def fake_vllm(monkeypatch, version="0.33.0"):
    """A vLLM 0.33 as far as the plugin reads it; each test breaks one piece."""
    mods = {}
    for name in ("vllm", "vllm.platforms", "vllm.config", "vllm.models", "vllm.v1.attention.backends.registry",
                 *TARGETS):
        mods[name] = types.ModuleType(name)
    mods["vllm"].__version__ = version
    mods["vllm.platforms"].current_platform = FakePlatform()

    class AttentionConfig:
        def __post_init__(self):
            pass

    mods["vllm.config"].AttentionConfig = AttentionConfig

    class _AttentionBackendEnumMeta(type):  # where vLLM turns --attention-backend into a member
        def __getitem__(cls, name):
            raise ValueError(f"Unknown attention backend: {name!r}")

    mods["vllm.v1.attention.backends.registry"].AttentionBackendEnum = _AttentionBackendEnumMeta(
        "AttentionBackendEnum", (), {})
    for name, (attr, params) in TARGETS.items():
        setattr(mods[name], attr, _function(params))
    for name, module in mods.items():
        monkeypatch.setitem(sys.modules, name, module)
    for name in [n for n in sys.modules if n.startswith("vllm.") and n not in mods]:
        monkeypatch.delitem(sys.modules, name)
    return mods


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    plugin.uninstall()
    yield
    plugin.uninstall()


class _Raises:
    def __init__(self, exc):
        self.exc = exc

    def __call__(self, *a, **k):
        raise self.exc


def _bad_signature():
    def f(vllm_config):
        pass

    f.__signature__ = "not a Signature"  # inspect.signature raises TypeError on it
    return f


class _RaisingModule(types.ModuleType):
    def __getattr__(self, name):
        raise RuntimeError(f"vllm.{name} exploded")


def _break(kind):
    """The 21 broken-vLLM variants: each returns a function that breaks the fake."""
    def version(value):
        return lambda m, mp: setattr(m["vllm"], "__version__", value)

    def platform_method(name, exc):
        return lambda m, mp: mp.setattr(FakePlatform, name, _Raises(exc))

    def target(name, value):
        return lambda m, mp: setattr(m[name], TARGETS[name][0], value)

    def unimportable(name, exc):
        def go(m, mp):
            class Finder:
                def find_spec(self, fullname, path=None, target=None):
                    if fullname == name:
                        raise exc
                    return None

            mp.delitem(sys.modules, name)
            mp.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
        return go

    nv = "vllm.models.deepseek_v4.nvidia.model"
    return {
        "no vllm": lambda m, mp: mp.setitem(sys.modules, "vllm", None),
        "vllm raises on import": unimportable("vllm", RuntimeError("CUDA driver too old")),
        "vllm exits on import": unimportable("vllm", SystemExit(3)),
        "version is an int": version(33),
        "version is None": version(None),
        "version is bytes": version(b"0.33.0"),
        "version is a list": version(["0", "33"]),
        "version is not a version": version("banana"),
        "version is another release": version("0.35.0"),
        "no version": lambda m, mp: delattr(m["vllm"], "__version__"),
        "no vllm.platforms": lambda m, mp: mp.setitem(sys.modules, "vllm.platforms", None),
        "current_platform raises": lambda m, mp: mp.setitem(sys.modules, "vllm.platforms",
                                                            _RaisingModule("vllm.platforms")),
        "is_cuda() raises": platform_method("is_cuda", RuntimeError("no driver")),
        "is_cuda() raises TypeError": platform_method("is_cuda", TypeError("bad")),
        "a target module raises on import": unimportable(nv, ImportError("undefined symbol")),
        "a target is missing": lambda m, mp: delattr(m[nv], "_select_dsv4_attn_cls"),
        "a target is not callable": target(nv, 42),
        "a target's signature changed": target(nv, _function("a, b, c")),
        "a target's signature raises": target(nv, _bad_signature()),
        "AttentionConfig is missing": lambda m, mp: delattr(m["vllm.config"], "AttentionConfig"),
        "the platform hook's signature changed": lambda m, mp: mp.setattr(
            FakePlatform, "check_and_update_config", classmethod(lambda cls, a, b: None)),
    }[kind]


VARIANTS = ["no vllm", "vllm raises on import", "vllm exits on import", "version is an int", "version is None",
            "version is bytes", "version is a list", "version is not a version", "version is another release",
            "no version", "no vllm.platforms", "current_platform raises", "is_cuda() raises",
            "is_cuda() raises TypeError", "a target module raises on import", "a target is missing",
            "a target is not callable", "a target's signature changed", "a target's signature raises",
            "AttentionConfig is missing", "the platform hook's signature changed"]


def test_the_fake_vllm_is_patched_when_nothing_is_broken(monkeypatch):
    mods = fake_vllm(monkeypatch)
    replaced = plugin.install()
    assert len(replaced) == 7
    assert mods["vllm.models.deepseek_v4.nvidia.model"]._select_dsv4_attn_cls.__wrapped_vllm__ is not None
    plugin.uninstall()
    assert mods["vllm.models.deepseek_v4.nvidia.model"]._select_dsv4_attn_cls(None) == "vllm"


@pytest.mark.parametrize("kind", VARIANTS)
def test_a_broken_vllm_gives_plugin_error_and_patches_nothing(monkeypatch, kind):
    mods = fake_vllm(monkeypatch)
    _break(kind)(mods, monkeypatch)
    originals = {name: getattr(mods[name], attr, None) for name, (attr, _) in TARGETS.items()}
    with pytest.raises(plugin.PluginError, match="patched nothing") as err:
        plugin.install()
    assert "\n" not in str(err.value)
    assert plugin._state["patched"] is None
    assert {name: getattr(mods[name], attr, None) for name, (attr, _) in TARGETS.items()} == originals
    # asked for by name: the same one error; installed only: one warning line, vLLM goes on
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver, dsv4sel")
    with pytest.raises(plugin.PluginError, match="VLLM_PLUGINS names dsv4sel"):
        plugin.register()


@pytest.mark.parametrize("kind", VARIANTS)
def test_installed_but_not_asked_for_a_broken_vllm_is_one_warning(monkeypatch, caplog, kind):
    mods = fake_vllm(monkeypatch)
    _break(kind)(mods, monkeypatch)
    with caplog.at_level(logging.INFO, logger="vllm.dsv4sel"):
        plugin.register()
        plugin._logged.discard(caplog.records[0].getMessage() if caplog.records else "")
    assert [r.levelname for r in caplog.records] == ["WARNING"], caplog.records
    assert "patched nothing" in caplog.records[0].getMessage() and "VLLM_PLUGINS" in caplog.records[0].getMessage()


def test_a_string_prefill_context_parallel_size_is_one_selection_error(monkeypatch):
    fake_vllm(monkeypatch)
    cfg = types.SimpleNamespace(
        attention_config=types.SimpleNamespace(backend=None), cache_config=types.SimpleNamespace(cache_dtype="auto"),
        parallel_config=types.SimpleNamespace(prefill_context_parallel_size="2", tensor_parallel_size=1))
    from dsv4sel.vllm_plugin import reading

    monkeypatch.setattr(reading, "_capability", lambda platform: "9.0")
    monkeypatch.setattr(reading, "_mega_attn", lambda *a: "unavailable")
    with pytest.raises(SelectionError, match=r"prefill_context_parallel_size is '2' \(str\); it must be an int"):
        plugin.query_of(cfg, "deepseek_v4_1")


def test_a_host_class_outside_vllms_deepseek_v4_modules_is_never_imported(monkeypatch):
    import dsv4sel
    from dsv4sel.engine.sources import default_packs

    fake_vllm(monkeypatch)
    rules = dsv4sel.load_rules([*default_packs(), str(RULES / "evil")])  # EVIL_DSV4 names vllm.evil:Anything
    sel = rules.select(platform="cuda", capability="9.0", backend="EVIL_DSV4", kv_cache_dtype="fp8_ds_mla")
    imported = []

    class Finder:
        def find_spec(self, fullname, path=None, target=None):
            imported.append(fullname)
            return None

    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    with pytest.raises(SelectionError, match=r"names the vLLM class vllm\.evil:Anything, which is not in one of "
                                             "vLLM's DeepSeek-V4 attention modules"):
        plugin.host_class(sel)
    assert "vllm.evil" not in imported and "vllm.evil" not in sys.modules


@pytest.mark.parametrize("body,error", [
    (None, "ModuleNotFoundError"),
    ("import sys\nsys.exit(0)\n", "SystemExit: 0"),
    ("raise RuntimeError('no CUDA here')\n", "RuntimeError: no CUDA here"),
], ids=["missing", "exits", "raises"])
def test_a_layer_module_that_will_not_import_is_one_selection_error(monkeypatch, tmp_path, body, error):
    """The config-time decision imports the rule's vLLM class: a layer module that is missing,
    exits or raises is one SelectionError naming the rule, the module and why, never the raw
    exception (nor a SystemExit that would end vLLM without a word)."""
    import dsv4sel

    fake_vllm(monkeypatch)
    module = "vllm.models.deepseek_v4.nvidia.flashmla"
    monkeypatch.delitem(sys.modules, module, raising=False)
    for parent in ("vllm.models", "vllm.models.deepseek_v4", "vllm.models.deepseek_v4.nvidia"):
        package = types.ModuleType(parent)
        package.__path__ = []  # a package: its submodule is looked up through sys.meta_path
        monkeypatch.setitem(sys.modules, parent, package)
    if body is not None:
        path = tmp_path / "flashmla.py"
        path.write_text(body)
        import importlib.util

        spec = importlib.util.spec_from_file_location(module, path)

        class Finder:
            def find_spec(self, fullname, p=None, target=None):
                return spec if fullname == module else None

        monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    sel = dsv4sel.select(platform="cuda", capability="9.0", kv_cache_dtype="auto")
    with pytest.raises(SelectionError) as info:
        plugin.host_class(sel)
    text = str(info.value)
    assert f"cannot import {module} ({error}" in text and sel.rule.location in text, text


def _own_module_pack(tmp_path):
    src = tmp_path / "src" / "own_kernels_pack"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text(
        "from dsv4sel.kernels.base import SparseMLAImpl\n\n\n"
        "class OwnImpl(SparseMLAImpl):  # an impl subclasses SparseMLAImpl, or it is none\n"
        "    '''A pack's kernel in its own module.'''\n\n"
        "    @classmethod\n"
        "    def import_library(cls):\n"
        "        raise ImportError('no kernel library here')\n\n"
        "    def run_library(self, plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink):\n"
        "        raise NotImplementedError\n")
    return RULES / "own", tmp_path / "src"  # OWN_DSV4 selects own_kernels_pack:OwnImpl


def test_the_environment_allows_a_packs_own_impl_module_for_select(monkeypatch, tmp_path):
    import dsv4sel
    from dsv4sel import RuleError

    rules, src = _own_module_pack(tmp_path)
    monkeypatch.syspath_prepend(str(src))
    monkeypatch.setenv("DSV4SEL_RULES_PATH", str(rules))
    monkeypatch.delenv("DSV4SEL_ALLOW_IMPL_MODULES", raising=False)
    with pytest.raises(RuleError) as refused:
        dsv4sel.load_rules()
    assert [(p.code, Path(p.file).resolve(), p.line) for p in refused.value.problems] == [
        ("DSV310", (rules / "own.yaml").resolve(), 7)]
    monkeypatch.setenv("DSV4SEL_ALLOW_IMPL_MODULES", "some.other, own_kernels_pack")
    sel = dsv4sel.load_rules().select(platform="cuda", capability="9.0", backend="OWN_DSV4",
                                      kv_cache_dtype="fp8_ds_mla")
    assert sel.load_impl().__name__ == "OwnImpl"
    # never from the cache: the entry just written is not served once the variable is gone
    monkeypatch.delenv("DSV4SEL_ALLOW_IMPL_MODULES")
    with pytest.raises(RuleError) as again:
        dsv4sel.load_rules()
    assert [p.code for p in again.value.problems] == ["DSV310"]


@pytest.mark.parametrize("value", ["own_kernels_pack;rm", "../x", "a..b", "ünï"])
def test_a_malformed_allowed_module_is_one_located_rule_error(monkeypatch, value):
    import dsv4sel
    from dsv4sel import RuleError

    monkeypatch.setenv("DSV4SEL_ALLOW_IMPL_MODULES", value)
    with pytest.raises(RuleError, match="DSV4SEL_ALLOW_IMPL_MODULES: .* is not a dotted module name") as err:
        dsv4sel.load_rules()
    assert err.value.problems[0].code == "DSV310"
