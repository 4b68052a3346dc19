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

ROOT = Path(__file__).resolve().parent.parent

#: Bottom first. A module may import its own layer and the layers below it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation: values, errors, text, the compiled format, the space algebra", (
        "_version", "record", "text", "suggest", "families", "capability", "codes", "hints", "errors", "values", "artifact", "hosts",
        "space", "scan", "flow")),
    ("engine: sources, load, validate, compile, cache, evaluate; machine detection", (
        "sources", "cache", "load", "validate", "model", "compile", "lower", "build", "ruleset", "alternatives",
        "platform")),
    ("verifier: dsv4sel check", ("findings", "cubes", "outcomes", "check_context", "check_tables", "check_flow",
                                 "check_selections", "verifier")),
    ("face: the public API", ("__init__",)),
    ("operator tools and embeddings", (
        "probe", "explain", "matrix", "diff", "doctor", "testcases", "vllm", "vllm_plugin")),
    ("cli", ("cli",)),
)
#: What the serving path (``import dsv4sel`` + ``select()``) may not import at module level.
SERVING = ("__init__", "ruleset", "artifact", "values", "errors", "record", "cache", "sources", "capability",
           "text", "_version", "codes", "suggest")
COMPILE_ONLY = ("yaml", "jsonschema", "torch", "dsv4sel.load", "dsv4sel.validate", "dsv4sel.compile",
                "dsv4sel.build", "dsv4sel.verifier")


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
    for index, (_, members) in enumerate(LAYERS):
        if short in members or short.split(".")[0] in members:
            return index
    raise AssertionError(f"{module} has no layer: add it to LAYERS in tests/test_layers.py")


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


def test_the_kernels_never_import_the_core():
    reach = sorted((m, t) for m in MODULES if m.startswith("dsv4sel.kernels")
                   for t in imports(m, MODULES[m]) if t.startswith("dsv4sel") and not t.startswith("dsv4sel.kernels"))
    assert reach == []


def test_the_core_reaches_the_kernels_only_through_the_platform_probe():
    # impl classes are named by strings in the rules and loaded from the allow-list
    reach = sorted((m, t) for m in MODULES if not m.startswith("dsv4sel.kernels")
                   for t in GRAPH[m] if t.startswith("dsv4sel.kernels"))
    assert reach == [("dsv4sel.platform", "dsv4sel.kernels.platform")]


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
    found = imports(module, MODULES[module], module_level_only=True)
    assert not [m for m in found if m in COMPILE_ONLY or m.split(".")[0] in COMPILE_ONLY]


def test_no_module_reads_a_private_attribute_of_the_rule_set():
    # RuleSet's read API (rows, index, row, items, keys, key_inputs, memo) is what tools use
    import re

    private = re.compile(r"\b(?:rules|ruleset|old|new)\._[a-z]\w*")
    found = [(str(path.relative_to(ROOT)), match.group())
             for name, path in MODULES.items() if name != "dsv4sel.ruleset"
             for match in private.finditer(path.read_text())]
    assert found == []
