"""A non-editable install ships the rules as package data and kernels as dsv4sel.kernels."""

import os
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), REPO], check=True, capture_output=True)
    (path,) = out.glob("dsv4sel-*.whl")
    return path


def test_the_wheel_holds_rules_schema_and_kernels_but_no_top_level_kernels(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n for n in os.listdir(os.path.join(REPO, "rules")) if n.endswith(".yaml"))
    assert sorted(n.split("/")[-1] for n in names if n.startswith("dsv4sel/rules/") and n.count("/") == 2) == shipped
    compat_dir = os.path.join(REPO, "rules", "compat", "vllm-0.33")
    compat = sorted(n for n in os.listdir(compat_dir) if n.endswith(".yaml"))
    assert sorted(n.split("/")[-1] for n in names if n.startswith("dsv4sel/rules/compat/vllm-0.33/")) == compat
    assert "dsv4sel/vllm_plugin/__init__.py" in names
    assert "dsv4sel/schema/rules.schema.json" in names
    assert "dsv4sel/kernels/__init__.py" in names
    assert not any(n.startswith("kernels/") for n in names)


def test_an_installed_wheel_selects_with_its_packaged_rules(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                    str(wheel)], check=True, capture_output=True)
    code = ("import dsv4sel, dsv4sel.sources as s\n"
            "sel = dsv4sel.select(platform='cuda', capability='9.0')\n"
            "print(s.shipped_rules_dir().startswith(%r), sel.backend, sel.rule.file)" % str(target))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]), DSV4SEL_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", code],
                         capture_output=True, text=True, env=env, cwd=str(tmp_path), check=True).stdout
    assert out.split() == ["True", "FLASHMLA_SPARSE_DSV4", "rules/flashmla.yaml"]
