"""The record a vLLM release folder declares (``tests/hosts/vllm/v0_XX/__init__.py``: ``RELEASE``),
and how a harness test finds the release it runs for (the folder of its test module)."""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

from _host_env import env_skip_reason

from dsv4sel.dsv4.host_registry import HOSTS

ROOT = Path(__file__).resolve().parents[4]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))

from vllm_env import cache_root, venv_for  # noqa: E402


@dataclass(frozen=True)
class VllmRelease:
    """One vLLM release the suite tests against its real package (one of the host registry's).

    ``version``: the release (``0.34.0``); its CPU test environment is tools/vllm_env.py's
    (``--version`` builds it), its compat set the registry's; ``other_version``: a vLLM the plugin
    is not written for (the version scenarios make the installed vLLM say it); ``host_classes``:
    how many vLLM classes the shipped rules name on this release; ``acknowledged``: the DSV408
    warnings its compat set acknowledges (a vLLM bug reproduced, not endorsed); ``lora_classes``:
    where LoRA decides, the class vLLM builds without LoRA -> the one it builds with LoRA instead
    (empty: this release does not read LoRA for DeepSeek-V4)."""

    version: str
    other_version: str
    host_classes: int
    acknowledged: int
    lora_classes: tuple[tuple[str, str], ...] = ()

    @property
    def minor(self) -> str:
        """``0.34``: how folders and file names name the release."""
        return ".".join(self.version.split(".")[:2])

    @property
    def label(self) -> str:
        return f"vLLM {self.version}"

    @property
    def env(self) -> Path:
        return ROOT / venv_for(self.version)

    @property
    def python(self) -> Path:
        return self.env / "bin" / "python"

    @property
    def vllm_cache(self) -> Path:
        """``VLLM_CACHE_ROOT`` of every vLLM process of this release (tools/vllm_env.py fills it)."""
        return cache_root(self.env)

    @property
    def stamp(self) -> Path:
        return self.env / ".dsv4sel-vllm-env"

    @property
    def compat(self) -> Path:
        registered = HOSTS["vllm"].release(self.version)
        if registered is None or registered.version != self.version:
            raise LookupError(f"vLLM {self.version} is not a release of dsv4sel/dsv4/host_registry.py")
        return ROOT / "rules" / registered.compat

    @property
    def fixes_doc(self) -> Path:
        return ROOT / "docs" / f"vllm-{self.minor}-fixes.md"

    @property
    def folder(self) -> Path:
        """The release's test folder (``tests/hosts/vllm/v0_34``)."""
        return HERE.parent / ("v" + self.minor.replace(".", "_"))

    def skip_reason(self) -> str | None:
        """None when its environment is built, else why its tests skip (and how to build it)."""
        return env_skip_reason(self.label, self.env, self.stamp, "vllm-env",
                               f"tools/vllm_env.py --version {self.version}")


def of_package(package: str) -> VllmRelease:
    """The release a release folder's package (``v0_34``) declares: its ``RELEASE``."""
    return importlib.import_module(package).RELEASE


def of_module(module_name: str) -> VllmRelease:
    """The release of a test module (``v0_34.test_differential``): its folder's ``RELEASE``."""
    package = module_name.rpartition(".")[0]
    if not package:
        raise LookupError(f"{module_name} is not in a release folder (tests/hosts/vllm/v0_XX/)")
    return of_package(package)
