"""What a user's ``pip install`` gets: the sdist and the wheel carry every
package, the rules, the schema and the license, and the wheel installed into
a fresh virtual environment without torch gives a working ``dsv4sel``."""

import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

from dsv4sel.dsv4.host_registry import HOSTS

from _repo import REPO

ROOT = Path(REPO)


def _tracked_packages() -> set[str]:
    """Every folder of Python code in the source tree, as installed package paths."""
    out = set()
    for base, installed in (("dsv4sel", "dsv4sel"), ("kernels", "dsv4sel/kernels")):
        for folder, _dirs, files in os.walk(ROOT / base):
            if "__pycache__" in folder:
                continue
            if any(f.endswith(".py") for f in files):
                out.add(installed + folder[len(str(ROOT / base)):])
    return out


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """An sdist, and a wheel built from that sdist (as ``python -m build`` does)."""
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), REPO],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Warning" not in proc.stderr and "deprecated" not in proc.stderr.lower(), proc.stderr[-3000:]
    (sdist,) = out.glob("dsv4sel-*.tar.gz")
    (wheel,) = out.glob("dsv4sel-*.whl")
    return sdist, wheel


def test_the_wheel_holds_every_package_the_rules_the_schema_and_the_license(dists):
    _, wheel = dists
    names = zipfile.ZipFile(wheel).namelist()
    folders = {n.rsplit("/", 1)[0] for n in names if n.endswith(".py")}
    assert _tracked_packages() <= folders, _tracked_packages() - folders
    assert "dsv4sel/cli/__init__.py" in names
    shipped = sorted(str(p.relative_to(ROOT / "rules")) for p in (ROOT / "rules").rglob("*.yaml"))
    assert sorted(n[len("dsv4sel/rules/"):] for n in names
                  if n.startswith("dsv4sel/rules/") and n.endswith(".yaml")) == shipped
    entry_points = next(zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith("entry_points.txt"))
    for host in HOSTS.values():  # every host's plugin, entry point and release folders, as the registry names them
        assert f"{host.plugin.replace('.', '/')}/__init__.py" in names
        assert f"[{host.group}]" in entry_points and f"dsv4sel = {host.target}" in entry_points
        for release in host.releases:
            assert f"{release.package.replace('.', '/')}/__init__.py" in names, release
            assert release.display in names, release
    assert "dsv4sel/schema/rules.schema.json" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("kernels/", "rules/", "tests/")) for n in names)
    metadata = next(zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith("METADATA"))
    assert "License-Expression: Apache-2.0" in metadata


def test_the_wheel_names_the_project_and_its_published_docs(dists):
    from dsv4sel._version import DOCS_URL

    _, wheel = dists
    names = zipfile.ZipFile(wheel).namelist()
    metadata = next(zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith("METADATA"))
    urls = dict(line[len("Project-URL: "):].split(", ", 1) for line in metadata.splitlines()
                if line.startswith("Project-URL: "))
    assert urls.keys() >= {"Homepage", "Documentation", "Source"}, metadata[:2000]
    # what messages and --help link to is the Documentation URL's tree
    assert urls["Documentation"] == DOCS_URL and all(u.startswith("https://") for u in urls.values())


#: Files whose ``docs/...`` strings are paths a command works on in a checkout (`dsv4sel table
#: --format md --check docs/backends.md`), not pages a message sends a reader to.
_DOCS_AS_A_PATH = {"dsv4sel/cli/render/table.py", "dsv4sel/cli/examples.py"}


def test_no_message_of_the_wheel_points_to_a_docs_file_it_does_not_carry(dists):
    """A wheel has no docs/ folder: a message or a help text that names a page links to the
    published docs (``DOCS_URL``), never to a bare ``docs/x.md``. Docstrings and comments are
    for the source's readers and are not looked at."""
    import ast
    import re

    from dsv4sel._version import DOCS_URL

    _, wheel = dists
    archive = zipfile.ZipFile(wheel)
    bare = re.compile(r"(?<![\w/.-])docs/[\w./-]+\.md")
    found = []
    for name in archive.namelist():
        if not name.endswith(".py") or name in _DOCS_AS_A_PATH:
            continue
        tree = ast.parse(archive.read(name).decode())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                found += [f"{name}:{node.lineno}: {m}" for m in bare.findall(node.value.replace(DOCS_URL, ""))]
    assert not found, found
    assert DOCS_URL in archive.read("dsv4sel/kernels/availability.py").decode()  # the kernels' own copy


def test_the_sdist_holds_what_a_rebuild_needs(dists):
    sdist, _ = dists
    names = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
    for needed in ("LICENSE", "README.md", "pyproject.toml", "setup.py", "dsv4sel/cli/__init__.py",
                   "dsv4sel/schema/rules.schema.json", "kernels/__init__.py", "rules/vocabulary.yaml"):
        assert needed in names, needed


@pytest.fixture(scope="module")
def fresh_venv(dists, tmp_path_factory):
    """The wheel installed into a new virtual environment: no torch, no repository on the path."""
    _, wheel = dists
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(home / "env")
    python = home / "env" / "bin" / "python"
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           str(wheel)], capture_output=True, text=True)
    if proc.returncode != 0 and "No matching distribution" in proc.stderr + proc.stdout:
        pytest.skip(f"pyyaml/jsonschema cannot be installed here (no package index): {proc.stderr[-500:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return home


def _in_venv(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["DSV4SEL_CACHE_DIR"] = str(home / "cache")
    return subprocess.run(list(args), capture_output=True, text=True, cwd=str(home), env=env, timeout=300)


def test_the_installed_command_runs_its_commands_without_torch(fresh_venv):
    bin_dir = fresh_venv / "env" / "bin"
    assert _in_venv(fresh_venv, str(bin_dir / "python"), "-c", "import torch").returncode != 0
    version = _in_venv(fresh_venv, str(bin_dir / "dsv4sel"), "--version")
    assert version.returncode == 0 and version.stdout.strip() == "dsv4sel 0.1.0", version
    check = _in_venv(fresh_venv, str(bin_dir / "dsv4sel"), "check")
    assert check.returncode == 0 and "clean:" in check.stdout, check
    explain = _in_venv(fresh_venv, str(bin_dir / "dsv4sel"), "explain", "--platform", "cuda",
                       "--capability", "9.0")
    assert explain.returncode == 0 and "FLASHMLA_SPARSE_DSV4" in explain.stdout, explain


def test_an_installed_explain_fits_100_columns_and_names_its_rules_from_the_package(fresh_venv):
    """Piped, a wheel's explain is wrapped at 100 columns, and the shipped rules (in
    site-packages) are named from the package on, each location whole on its line."""
    import re

    bin_dir = fresh_venv / "env" / "bin"
    explain = _in_venv(fresh_venv, str(bin_dir / "dsv4sel"), "explain", "--platform", "cuda",
                       "--capability", "9.0", "--kv-cache-dtype", "fp8")
    assert explain.returncode == 0, explain
    out = explain.stdout
    assert "site-packages" not in out, out
    assert re.search(r"^  decided by\s+flashmla-fp8  dsv4sel/rules/flashmla\.yaml:\d+$", out, re.M), out
    assert re.search(r"^  1  \S+\s+dsv4sel/rules/defaults\.yaml:\d+\s", out, re.M), out
    assert max(len(line) for line in out.splitlines()) <= 100, out


def test_the_installed_package_selects_with_its_packaged_rules(fresh_venv):
    code = ("import dsv4sel, dsv4sel.engine.sources as s, sys\n"
            "sel = dsv4sel.select(platform='cuda', capability='9.0')\n"
            "print(s.shipped_rules_dir().startswith(sys.prefix), sel.backend, sel.rule.file,\n"
            "      'torch' in sys.modules, 'yaml' in sys.modules)")
    python = fresh_venv / "env" / "bin" / "python"
    first = _in_venv(fresh_venv, str(python), "-c", code)
    assert first.returncode == 0, first
    # `check` compiled the rules before: this process reads the cache and imports no yaml
    assert first.stdout.split() == ["True", "FLASHMLA_SPARSE_DSV4", "rules/flashmla.yaml", "False", "False"]


def test_the_wheel_ships_the_compiled_rules_and_select_reads_nothing_a_user_can_write(dists, fresh_venv):
    # built by setup.py's hook from the very files the wheel ships: a fresh process with an
    # empty cache directory answers from the package, compiles nothing and writes no cache
    _, wheel = dists
    assert "dsv4sel/shipped.dsv4c" in zipfile.ZipFile(wheel).namelist()
    code = ("import dsv4sel, sys, os\n"
            "sel = dsv4sel.select(platform='cuda', capability='9.0')\n"
            "print(sel.backend, 'yaml' in sys.modules, os.path.exists(os.environ['DSV4SEL_CACHE_DIR']))")
    python = fresh_venv / "env" / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["DSV4SEL_CACHE_DIR"] = str(fresh_venv / "never-created")
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=str(fresh_venv),
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["FLASHMLA_SPARSE_DSV4", "False", "False"]


def test_the_build_hook_gets_every_package_the_compiler_imports():
    """``pip wheel .`` builds in an isolated environment holding only ``[build-system] requires``,
    and the build hook (setup.py) compiles the shipped rules with the package's own code: every
    runtime dependency must be a build requirement too, or a user's non-editable install fails
    (the suite's own build above runs ``--no-isolation`` and would not see it)."""
    import tomllib

    from packaging.requirements import Requirement

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    build = {Requirement(r).name for r in data["build-system"]["requires"]}
    runtime = {Requirement(r).name for r in data["project"]["dependencies"]}
    assert runtime <= build, f"add {sorted(runtime - build)} to [build-system] requires"
