"""The import-layer contract: the house's walls, checked on every run.

Every module of ``dsv4sel`` (and ``kernels/``, installed as
``dsv4sel.kernels``) belongs to one layer of :data:`LAYERS`, and imports
only modules of its own layer or of lower ones; every import counts, also
one inside a function. The kernels import nothing of dsv4sel outside
themselves. There is no import cycle. A new module must be given a layer
here, which is the moment to decide where it belongs.

This is the contract import-linter would check; it is written out because
import-linter's graph builder finds packages by walking their directory and
so cannot see ``kernels/`` mapped in as ``dsv4sel.kernels``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dsv4sel.dsv4.host_registry import HOSTS

ROOT = Path(__file__).resolve().parents[2]

#: Bottom first. A module may import its own layer and the layers below it.
#: A name stands for the module or, for a package, every module in it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation: the version, frozen values, the exceptions, the command process", ("_version", "record", "errors",
                                                                             "process")),
    ("engine foundation: results, codes, the compiled format, the space algebra", tuple(f"engine.{m}" for m in (
        "text", "suggest", "families", "codes", "hints", "values", "profile", "artifact", "hosts",
        "space", "scan", "flow"))),
    ("engine: sources, load, validate, compile, lower, cache, evaluate", ("engine",)),
    ("dsv4: the DeepSeek-V4 profile handed to the engine, and machine detection", ("dsv4",)),
    ("translation: a host's own inputs mapped onto the rules, as data", ("translation",)),
    ("check: the verifier", ("check",)),
    ("face: the public API", ("__init__", "api")),
    # the hosts' plugins, as the host registry names them (a new host's plugin needs no edit here)
    ("operator tools and embeddings", ("tools", "vllm", *(h.plugin.removeprefix("dsv4sel.") for h in HOSTS.values()))),
    ("cli", ("cli",)),
)
#: What the serving path (``import dsv4sel`` + ``select()``) may not import at module level.
SERVING = ("__init__", "api", "engine.ruleset", "engine.artifact", "engine.values", "errors", "record",
           "engine.cache", "engine.sources", "engine.profile", "dsv4.profile", "dsv4.rules", "dsv4.selection",
           "engine.text", "_version", "engine.codes", "engine.suggest", "process")
COMPILE_ONLY = ("yaml", "jsonschema", "torch", "dsv4sel.engine.load", "dsv4sel.engine.validate",
                "dsv4sel.engine.compile", "dsv4sel.engine.build", "dsv4sel.engine.lower", "dsv4sel.check")


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in (("dsv4sel", "dsv4sel"), ("kernels", "dsv4sel.kernels")):
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((package, *parts))] = path
    return out


MODULES = _modules()


def imports(name: str, path: Path, *, module_level_only: bool = False) -> set[str]:
    """The modules ``name`` imports (absolute names); ``from . import sub`` is the submodule."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            subs = {f"{module}.{alias.name}" for alias in node.names} & MODULES.keys()
            out.update(subs)
            if len(subs) < len(node.names):
                out.add(module)
    return out - {name}


def layer_of(module: str) -> int | None:
    if module.startswith("dsv4sel.kernels"):
        return None
    short = module[len("dsv4sel."):] if module != "dsv4sel" else "__init__"
    best = None  # the longest member naming the module or a package above it
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            if (short == member or short.startswith(member + ".")) and (best is None or len(member) > best[1]):
                best = (index, len(member))
    if best is not None:
        return best[0]
    raise AssertionError(f"{module} has no layer: add it to LAYERS in tests/product/test_layers.py")


GRAPH = {name: imports(name, path) & MODULES.keys() for name, path in MODULES.items()}


def test_every_module_has_a_layer():
    for module in MODULES:
        layer_of(module)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not m.startswith("dsv4sel.kernels")))
def test_no_import_runs_up_a_layer(module):
    mine = layer_of(module)
    upward = sorted(target for target in GRAPH[module]
                    if not target.startswith("dsv4sel.kernels") and layer_of(target) > mine)
    assert upward == [], f"{module} ({LAYERS[mine][0]}) imports a higher layer: {upward}"


def test_every_import_of_the_package_names_a_module_of_it():
    # a relative import one dot short (``from ..engine import x`` in a subpackage) names
    # nothing; the graph above would drop it silently and only running the code would tell
    missing = sorted((m, t) for m, path in MODULES.items() for t in imports(m, path)
                     if t.split(".")[0] == "dsv4sel" and t not in MODULES)
    assert missing == []


def test_the_kernels_never_import_the_core():
    reach = sorted((m, t) for m in MODULES if m.startswith("dsv4sel.kernels")
                   for t in imports(m, MODULES[m]) if t.startswith("dsv4sel") and not t.startswith("dsv4sel.kernels"))
    assert reach == []


def test_the_core_reaches_the_kernels_only_through_the_platform_probe_and_the_record_table():
    # impl classes are named by strings in the rules and loaded from the allow-list; the KV wire
    # contract reads the records' sizes and encodings from the kernels' plain-data record table
    reach = sorted((m, t) for m in MODULES if not m.startswith("dsv4sel.kernels")
                   for t in GRAPH[m] if t.startswith("dsv4sel.kernels"))
    assert reach == [("dsv4sel.dsv4.contract", "dsv4sel.kernels.record"),
                     ("dsv4sel.dsv4.platform", "dsv4sel.kernels.platform")]
    assert imports("dsv4sel.kernels.record", MODULES["dsv4sel.kernels.record"]) == set()


def test_there_is_no_import_cycle():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                cycle = stack[stack.index(target):] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)


@pytest.mark.parametrize("short", SERVING)
def test_the_serving_path_imports_no_compiler_at_module_level(short):
    module = "dsv4sel" if short == "__init__" else f"dsv4sel.{short}"
    if module not in MODULES:
        pytest.fail(f"{module} is named in SERVING but does not exist")
    found = imports(module, MODULES[module], module_level_only=True)
    assert not [m for m in found if m in COMPILE_ONLY or m.split(".")[0] in COMPILE_ONLY]


def test_no_module_reads_a_private_attribute_of_the_rule_set():
    # RuleSet's read API (rows, index, row, items, keys, key_inputs, memo) is what tools use
    import re

    private = re.compile(r"\b(?:rules|ruleset|old|new)\._[a-z]\w*")
    found = [(str(path.relative_to(ROOT)), match.group())
             for name, path in MODULES.items() if name != "dsv4sel.engine.ruleset"
             for match in private.finditer(path.read_text())]
    assert found == []


#: What only the DeepSeek-V4 profile may know: its inputs, select fields, words and hosts.
DOMAIN_WORDS = ("deepseek", "kv_cache_dtype", "cache_dtype", "torch", "bytes_per_token", "block_size",
                "capability", "platform", "vllm", "attention", "flashmla", "flashinfer")


def _code_words(path: Path) -> set[str]:
    """Identifiers and non-docstring string constants of a module: its code, not its prose."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str)}
    words = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words.add(node.value)
        elif isinstance(node, ast.Name):
            words.add(node.id)
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, ast.arg):
            words.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            words.add(node.name)
    return words


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("dsv4sel.engine")))
def test_the_engine_knows_no_deepseek(module):
    # the profile (dsv4sel.dsv4.profile) hands the engine what these words mean
    found = sorted({word for text in _code_words(MODULES[module]) for word in DOMAIN_WORDS if word in text.lower()})
    assert found == [], f"{module} names DeepSeek-V4 things in its code: {found}"
