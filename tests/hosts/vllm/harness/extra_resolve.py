"""What ``pip install 'dsv4sel[vllm]'`` would install next to the vLLM of a release's environment (runs there).

    VENV/bin/python tests/hosts/vllm/harness/extra_resolve.py REPO STANDINS_DIR

The suite's vLLM is installed with ``--no-deps`` (the CPU recipe, tools/vllm_env.py): its own
requirements that need a GPU (torch 2.14.0, FlashInfer, the CUDA kernel packages) are missing,
so any resolver run there would try to fetch them for vLLM's sake, whatever dsv4sel asks. A user
installs dsv4sel next to a vLLM whose requirements are met. To ask pip that question here, this
writes, for every requirement of an installed distribution that is not met, a stand-in
distribution's metadata (``NAME-VERSION.dist-info/METADATA``: name and a version that meets it,
no code, no requirements of its own) into STANDINS_DIR, then runs pip's own resolver,
``pip install --dry-run --no-index --report`` on ``REPO[vllm]`` with STANDINS_DIR on the path,
and prints one JSON line: the stand-ins written and what pip would install (name, version).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version


def _installed() -> dict[str, str]:
    out: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(name.lower().replace("_", "-"), dist.version)
    return out


def _meeting(req: Requirement) -> str:
    """A version that meets ``req``'s specifier (its ``==`` pin or its lowest bound)."""
    for spec in req.specifier:
        if spec.operator in ("==", "===", ">=", "~="):
            return spec.version.replace(".*", ".0")
    return "0"


def unmet() -> dict[str, str]:
    """``{name: version}`` for each requirement of an installed distribution that is not met."""
    installed = _installed()
    need: dict[str, str] = {}
    for dist in metadata.distributions():
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            name = req.name.lower().replace("_", "-")
            have = installed.get(name)
            if have is not None and req.specifier.contains(Version(have).public, prereleases=True):
                continue
            need[name] = _meeting(req)
    return need


def write_standins(directory: Path, need: dict[str, str]) -> None:
    for name, version in need.items():
        info = directory / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("dsv4sel-test-standin\n")


def main() -> int:
    repo, standins = Path(sys.argv[1]), Path(sys.argv[2])
    need = unmet()
    write_standins(standins, need)
    report = standins.parent / "pip-report.json"
    env = dict(os.environ, PYTHONPATH=str(standins), PIP_DISABLE_PIP_VERSION_CHECK="1")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                           "--quiet", "--report", str(report), f"{repo}[vllm]"],
                          capture_output=True, text=True, env=env, cwd=standins.parent)
    install = []
    if proc.returncode == 0:
        install = [(i["metadata"]["name"], i["metadata"]["version"]) for i in json.loads(report.read_text())["install"]]
    errors = [line for line in proc.stderr.splitlines() if "is ignored" not in line]
    print(json.dumps({"standins": need, "rc": proc.returncode, "install": install, "stderr": errors[-20:]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
