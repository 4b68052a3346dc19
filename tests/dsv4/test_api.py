"""The embedding API: frozen Selection values, lazy torch, impl loading, all-or-nothing rewrites."""

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

import dsv4sel
from dsv4sel import ImplLoadError, InvalidQuery, SelectionError


def sm90():
    return dsv4sel.select(platform="cuda", capability="9.0", kv_cache_dtype="fp8")


def test_selection_is_frozen_and_hashable():
    sel = sm90()
    with pytest.raises(AttributeError, match="frozen"):
        sel.backend = "X"
    with pytest.raises(TypeError):
        sel.rewrites["cache_dtype"] = "auto"
    assert hash(sel) == hash(sm90()) and sel == sm90()


def test_torch_dtype_is_resolved_lazily():
    import torch

    sel = sm90()
    assert sel.torch_dtype is torch.uint8
    fi = dsv4sel.select(platform="cuda", capability="10.0", backend="FLASHINFER_MLA_SPARSE_DSV4",
                        kv_cache_dtype="fp8")
    assert fi.torch_dtype is torch.float8_e4m3fn


def test_load_impl_returns_the_named_class():
    cls = sm90().load_impl()
    assert (cls.__module__, cls.__name__) == ("dsv4sel.kernels.flashmla", "DeepseekV4FlashMLASparseImpl")


def test_load_impl_refuses_modules_outside_the_allow_list():
    forged = sm90().replace(impl="os:system")
    with pytest.raises(ImplLoadError, match=r"outside the allowed modules \(dsv4sel.kernels\)"):
        forged.load_impl()
    lookalike = sm90().replace(impl="dsv4sel.kernelsevil:X")
    with pytest.raises(ImplLoadError):
        lookalike.load_impl()


def test_load_impl_reports_a_missing_class():
    forged = sm90().replace(impl="dsv4sel.kernels.flashmla:NoSuchImpl")
    with pytest.raises(ImplLoadError, match="has no class 'NoSuchImpl'"):
        forged.load_impl()


@pytest.mark.parametrize(("impl", "is_what"), [
    ("dsv4sel.kernels.base:Any", "is the class typing.Any"),                 # what a module imported
    ("dsv4sel.kernels.flashmla:__class__", "is the class builtins.module"),  # a dunder every module has
    ("dsv4sel.kernels.layouts:KVCacheLayout", "is a class"),                  # a class, but no impl
    ("dsv4sel.kernels.base:SparseMLAImpl", "is the base class itself"),
    ("dsv4sel.kernels:IMPLS", "is a tuple, not a class"),
])
def test_load_impl_returns_only_a_subclass_of_the_impl_base(impl, is_what):
    # issue 32 point 5: an allow-listed module exposes more than impls; none of it is returned
    with pytest.raises(ImplLoadError) as info:
        sm90().replace(impl=impl).load_impl()
    module, _, attr = impl.partition(":")
    assert str(info.value).startswith(
        f"FLASHMLA_SPARSE_DSV4: impl {impl!r}: {module}.{attr} {is_what}, not an impl: an impl is a subclass of "
        "dsv4sel.kernels.base.SparseMLAImpl; it was selected by rule flashmla-fp8 (rules/flashmla.yaml:")


def test_apply_rewrites_the_cache_config_and_returns_old_values():
    config = SimpleNamespace(cache_dtype="fp8", block_size=16)
    assert sm90().apply(config) == {"cache_dtype": "fp8"}
    assert config.cache_dtype == "fp8_ds_mla" and config.block_size == 16


def test_apply_is_all_or_nothing():
    class Strict:
        __slots__ = ("cache_dtype", "other")

    sel = sm90().replace(rewrites={"cache_dtype": "fp8_ds_mla", "missing": 1})
    config = Strict()
    config.cache_dtype = "fp8"
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        sel.apply(config)
    assert config.cache_dtype == "fp8"

    class Exploding:
        """A config whose second attribute refuses the write half-way through."""

        def __init__(self):
            object.__setattr__(self, "cache_dtype", "fp8")
            object.__setattr__(self, "block_size", 16)

        def __setattr__(self, name, value):
            if name == "block_size":
                raise ValueError("read-only")
            object.__setattr__(self, name, value)

    boom = Exploding()
    sel = sm90().replace(rewrites={"cache_dtype": "fp8_ds_mla", "block_size": 256})
    with pytest.raises(ValueError, match="read-only"):
        sel.apply(boom)
    assert (boom.cache_dtype, boom.block_size) == ("fp8", 16)


def test_apply_refuses_a_config_the_selection_was_not_decided_for():
    # issue 32 point 12: a selection made for `auto` applied to an fp8_e5m2 config rewrote it to
    # fp8_ds_mla, the headline bug back through the API; now it is refused, naming both values
    sel = dsv4sel.select(platform="cuda", capability="9.0", kv_cache_dtype="auto")
    config = SimpleNamespace(cache_dtype="fp8_e5m2", block_size=16)
    with pytest.raises(SelectionError) as info:
        sel.apply(config)
    assert str(info.value) == (
        "FLASHMLA_SPARSE_DSV4: cannot apply the selection of rule flashmla-fp8 (rules/flashmla.yaml:"
        f"{sel.rule.line}) to SimpleNamespace: its cache_dtype is 'fp8_e5m2', but this selection was decided for "
        "kv_cache_dtype 'auto'; select again with kv_cache_dtype='fp8_e5m2'; nothing was changed")
    assert config == SimpleNamespace(cache_dtype="fp8_e5m2", block_size=16)
    assert info.value.rule == sel.rule
    # a selection without rewrites is held to the same: it was not made for this config either
    kept = dsv4sel.select(platform="cuda", capability="9.0", kv_cache_dtype="fp8_ds_mla")
    with pytest.raises(SelectionError, match="decided for kv_cache_dtype 'fp8_ds_mla'"):
        kept.apply(config)


def test_apply_takes_the_config_it_was_decided_for_however_spelt_and_once_applied():
    sel = dsv4sel.select(platform="cuda", capability="9.0", kv_cache_dtype="FP8 ")
    config = SimpleNamespace(cache_dtype="FP8 ")  # the spelling select() was given
    assert sel.apply(config) == {"cache_dtype": "FP8 "} and config.cache_dtype == "fp8_ds_mla"
    assert sel.apply(config) == {}  # applied again: the value it gives is already there
    assert config.cache_dtype == "fp8_ds_mla"


@pytest.mark.parametrize(("rewrites", "says"), [
    ({"__dict__": {}}, "cannot rewrite '__dict__': not a field name: rule files write lowercase letters, digits and _"),
    ({"__class__": "x"}, "cannot rewrite '__class__': not a field name"),
    ({"cache_dtype": 3}, "cannot rewrite 'cache_dtype': the field holds a str, not an int (3)"),
    ({"extra": ["a"]}, "cannot rewrite 'extra': a rewrite holds a str, an int or a bool, not a list"),
])
def test_replace_takes_only_rewrites_rule_files_could_write(rewrites, says):
    # issue 32 point 11: replace(rewrites={'__dict__': ...}) then apply() wiped the config
    with pytest.raises(SelectionError) as info:
        sm90().replace(rewrites=rewrites)
    assert str(info.value).startswith(says)


def test_apply_sets_only_settable_fields_and_changes_nothing_otherwise():
    class Config:
        def __init__(self):
            self.cache_dtype = "fp8"

        def clear(self):
            """A method: a rewrite must not replace it."""

        @property
        def pool(self):
            return "main"

    for name, says in (("clear", "Config.clear is a method, not a field"),
                       ("pool", "Config.pool is a read-only property")):
        config = Config()
        with pytest.raises(SelectionError) as info:
            sm90().replace(rewrites={"cache_dtype": "fp8_ds_mla", name: "x"}).apply(config)
        assert f"cannot rewrite {name!r}: {says}; nothing was changed" in str(info.value)
        assert config.cache_dtype == "fp8" and callable(config.clear) and config.pool == "main"


def test_backend_may_be_an_enum_member_or_any_case():
    import enum

    class AttentionBackendEnum(enum.Enum):
        FLASHINFER_MLA_SPARSE_DSV4 = enum.auto()

    by_enum = dsv4sel.select(platform="cuda", capability="10.0", kv_cache_dtype="fp8",
                             backend=AttentionBackendEnum.FLASHINFER_MLA_SPARSE_DSV4)
    by_name = dsv4sel.select(platform="cuda", capability="10.0", kv_cache_dtype="fp8",
                             backend="flashinfer_mla_sparse_dsv4")
    assert by_enum.backend == by_name.backend == "FLASHINFER_MLA_SPARSE_DSV4"


@pytest.mark.parametrize("query,needle", [
    (dict(platform="tpu"), "unknown platform 'tpu'"),
    (dict(platform="cuda", kv_cache_dtype="fp8_e4m4"), "did you mean 'fp8_e4m3'"),
    (dict(platform="cuda", capability=9.0), "9.0 is not a cuda capability"),
    (dict(platform="cuda", model="llama"), "unknown model 'llama'"),
    (dict(platform="cuda", colour="red"), "unknown input 'colour'"),
])
def test_bad_queries_raise_invalid_query_naming_the_problem(query, needle):
    with pytest.raises(InvalidQuery, match=needle):
        dsv4sel.select(**query)


def test_selection_error_is_a_value_error_with_the_rule_and_suggestions():
    with pytest.raises(ValueError) as info:
        dsv4sel.select(platform="cuda", capability="9.0", kv_cache_dtype="bfloat16")
    error = info.value
    assert isinstance(error, SelectionError)
    assert error.rule.id == "flashmla-unsupported-dtype" and error.rule.file == "rules/flashmla.yaml"
    assert "--kv-cache-dtype auto" in error.suggestions
    assert "'bfloat16'" in str(error) and "cuda 9.0" in str(error)


def test_memoized_results_are_the_same_object_and_errors_are_fresh():
    assert sm90() is sm90()
    errors = []
    for _ in range(2):
        try:
            dsv4sel.select(platform="cuda", capability="9.0", kv_cache_dtype="bfloat16")
        except SelectionError as exc:
            errors.append(exc)
    assert errors[0] is not errors[1] and str(errors[0]) == str(errors[1])


def test_explicit_rule_sets_are_independent_of_the_default():
    rules = dsv4sel.load_rules()
    assert dsv4sel.select(platform="cpu", rules=rules).backend == "CPU_V4_MLA_SPARSE"
    assert isinstance(rules.digest, str) and len(rules.digest) == 64


def test_record_is_one_line_naming_the_inputs_and_rule():
    line = sm90().record()
    assert "\n" not in line
    assert "platform=cuda capability=9.0" in line and "rule=flashmla-fp8@rules/flashmla.yaml:" in line


def run_python(code: str, env_extra: dict) -> str:
    import os

    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=True).stdout


def test_a_warm_cache_imports_neither_torch_yaml_nor_jsonschema(tmp_path):
    code = ("import sys, dsv4sel\n"
            "s = dsv4sel.select(platform='cuda', capability='9.0')\n"
            "print(s.backend, *sorted(m for m in ('torch', 'yaml', 'jsonschema') if m in sys.modules))")
    env = {"DSV4SEL_CACHE_DIR": str(tmp_path / "cache")}
    # the first run answers from the packaged artifact, or (a checkout whose artifact `make`
    # has not rebuilt since an edit) compiles and writes the user cache
    assert run_python(code, env).split()[0] == "FLASHMLA_SPARSE_DSV4"
    assert run_python(code, env).split() == ["FLASHMLA_SPARSE_DSV4"]


def test_a_corrupt_cache_entry_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4SEL_CACHE_DIR", str(tmp_path))
    digest = dsv4sel.load_rules().digest
    (tmp_path / f"{digest}.marshal").write_bytes(b"not marshal data")
    assert dsv4sel.load_rules().digest == digest
    assert dsv4sel.select(platform="cpu", rules=dsv4sel.load_rules()).backend == "CPU_V4_MLA_SPARSE"


def test_the_default_rules_plus_a_pack_in_a_fresh_interpreter(tmp_path):
    # issue 32 point 14: the documented recipe raised AttributeError in a fresh interpreter
    # (dsv4sel.engine.sources was never imported); `extra=` is the public way, and the one
    # the README, docs/adding-a-backend.md and DSV306's message give
    from _cli import REPO

    pack = REPO / "examples" / "b12x-pack"
    code = ("import dsv4sel\n"
            f"rules = dsv4sel.load_rules(extra=[{str(pack / 'dsv4sel_b12x' / 'rules')!r}],\n"
            "                           allowed_impl_modules=['dsv4sel_b12x'])\n"
            "print(dsv4sel.select(platform='cuda', capability='12.1', rules=rules).backend,\n"
            "      dsv4sel.select(platform='cuda', capability='9.0', rules=rules).backend,\n"
            f"      dsv4sel.verify(extra=[{str(pack / 'dsv4sel_b12x' / 'rules')!r}],\n"
            "                     allowed_impl_modules='dsv4sel_b12x').ok)\n")
    env = {"DSV4SEL_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": os.pathsep.join((str(pack), *sys.path))}
    assert run_python(code, env).split() == ["B12X_MLA_SPARSE", "FLASHMLA_SPARSE_DSV4", "True"]


def test_extra_packs_go_on_top_of_the_default_set_with_its_allow_list(monkeypatch):
    from _cli import REPO

    rules = REPO / "examples" / "b12x-pack" / "dsv4sel_b12x" / "rules"
    monkeypatch.setenv("DSV4SEL_ALLOW_IMPL_MODULES", "dsv4sel_b12x")  # the process configuration's
    loaded = dsv4sel.load_rules(extra=[str(rules)])
    assert "dsv4sel_b12x" in loaded.allowed_impl_modules
    assert dsv4sel.select(platform="cuda", capability="12.1", rules=loaded).backend == "B12X_MLA_SPARSE"
    # on explicit paths, `extra` goes on top of them
    alone = dsv4sel.load_rules([str(REPO / "rules")], extra=str(rules), allowed_impl_modules="dsv4sel_b12x")
    assert [os.path.basename(s) for s in alone.sources[-2:]] == ["b12x.yaml", "defaults.yaml"]
    with pytest.raises(ValueError, match="extra= adds rule packs to rule paths"):
        dsv4sel.verify(dsv4sel.default_rules(), extra=[str(rules)])
