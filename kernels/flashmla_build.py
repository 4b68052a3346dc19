"""Which FlashMLA build the adapter calls: :func:`flashmla_build` (the ``flash_mla`` package,
``$DSV4SEL_VLLM_FLASHMLA_DIR``, the installed vLLM's bundled build), loaded by path without
importing vLLM; see :mod:`dsv4sel.kernels.flashmla` for the order and what is loaded.

This module imports neither torch nor a kernel library until a build is loaded.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
import threading
import types
from typing import Any, NamedTuple

__all__ = [
    "FLASHMLA_INSTALL_HINT",
    "FlashMLABuild",
    "VLLM_FLASHMLA_DIR_ENV",
    "flashmla_build",
    "load_flashmla",
    "load_vllm_flashmla",
]

FLASHMLA_INSTALL_HINT = (
    "install FlashMLA from https://github.com/deepseek-ai/FlashMLA "
    "(git clone --recursive, then pip install --no-build-isolation . with a CUDA build of torch), "
    "or vLLM (its wheel bundles FlashMLA: pip install vllm==0.33.0), or point "
    "DSV4SEL_VLLM_FLASHMLA_DIR at a copy of vLLM's bundled build; PyPI's flash-mla is a broken placeholder"
)

#: Environment variable naming a folder with vLLM's bundled FlashMLA build
#: (``vllm/_flashmla_C.abi3.so`` + ``vllm/third_party/flashmla/flash_mla_interface.py``).
VLLM_FLASHMLA_DIR_ENV = "DSV4SEL_VLLM_FLASHMLA_DIR"

_INTERFACE_PARTS = ("third_party", "flashmla", "flash_mla_interface.py")
_EXTENSION = "_flashmla_C"


class FlashMLABuild(NamedTuple):
    """Which FlashMLA build the adapter uses; what :func:`flashmla_build` returns.

    Attributes:
        source: ``"flash_mla"`` (the FlashMLA package), ``"vllm-dir"`` (the folder
            in ``DSV4SEL_VLLM_FLASHMLA_DIR``), ``"vllm"`` (the installed vLLM's
            bundled build), or ``"none"``.
        module: the loaded interface module (None when ``source == "none"``).
        location: the file the kernels come from (interface or extension path), or "".
        version: the package version when known (FlashMLA's, or vLLM's for the bundled build).
        reason: for ``"none"``, why nothing loaded and what to install.
    """

    source: str
    module: Any
    location: str
    version: str | None
    reason: str

    @property
    def found(self) -> bool:
        return self.source != "none"

    def describe(self) -> str:
        """One line: which build, from where (or why none)."""
        if self.source == "flash_mla":
            return f"FlashMLA package flash_mla{' ' + self.version if self.version else ''} ({self.location})"
        if self.source == "vllm":
            return f"vLLM{' ' + self.version if self.version else ''}'s bundled FlashMLA ({self.location})"
        if self.source == "vllm-dir":
            return f"vLLM's bundled FlashMLA from ${VLLM_FLASHMLA_DIR_ENV} ({self.location})"
        return f"no FlashMLA build: {self.reason}"


_lock = threading.Lock()
#: Interface modules loaded by path, by interface file: a build is loaded once per process.
_loaded: dict[str, types.ModuleType] = {}



def _check_interface(module: Any, name: str) -> Any:
    fn = getattr(module, "flash_mla_with_kvcache", None)
    if fn is None or not hasattr(module, "get_mla_metadata"):
        raise ImportError(f"{name} has no flash_mla_with_kvcache / get_mla_metadata")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a C function: trust it
        return module
    missing = {"indices", "is_fp8_kvcache", "attn_sink"} - set(params)
    if missing:
        raise ImportError(
            f"{name} is too old for sparse decode (flash_mla_with_kvcache lacks {', '.join(sorted(missing))})"
        )
    return module


def _vllm_package_dir() -> str | None:
    """The installed vllm package's folder, found without importing vllm (None if absent or blocked)."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _vllm_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("vllm")
    except (ImportError, KeyError):  # PackageNotFoundError is an ImportError; KeyError: no Version (3.12+)
        return None


def _bundle_root(folder: str) -> str:
    """``folder`` or ``folder/vllm``: the one holding ``third_party/flashmla``."""
    nested = os.path.join(folder, "vllm")
    if os.path.isfile(os.path.join(nested, *_INTERFACE_PARTS)):
        return nested
    return folder


def _load_bundle(vllm_dir: str) -> types.ModuleType:
    """Load ``vllm_dir``'s FlashMLA extension and interface module by path; never imports vllm itself."""
    interface_path = os.path.join(vllm_dir, *_INTERFACE_PARTS)
    if not os.path.isfile(interface_path):
        raise ImportError(f"no FlashMLA interface module at {interface_path}")
    with _lock:
        cached = _loaded.get(interface_path)
        if cached is not None:
            return cached
        import torch  # noqa: F401  (the extension links libtorch: torch must be loaded first)

        ext_spec = importlib.machinery.PathFinder.find_spec(_EXTENSION, [vllm_dir])
        if ext_spec is None or ext_spec.origin is None:
            raise ImportError(f"no {_EXTENSION} extension in {vllm_dir}")
        # The interface module does `import vllm._flashmla_C`: give it the extension under
        # that name while it runs, with a stand-in parent package when vllm is not imported.
        ext_name = "vllm." + _EXTENSION
        ext = sys.modules.get(ext_name)
        if ext is None:
            spec = importlib.util.spec_from_file_location(ext_name, ext_spec.origin)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {ext_spec.origin}")
            ext = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(ext)  # registers torch.ops._flashmla_C
        saved: dict[str, Any] = {name: sys.modules.get(name, _MISSING) for name in ("vllm", ext_name)}
        if not isinstance(saved["vllm"], types.ModuleType):
            parent = types.ModuleType("vllm")
            parent.__path__ = []  # a package, so `import vllm.<x>` resolves through sys.modules only
            setattr(parent, _EXTENSION, ext)  # what `import vllm._flashmla_C` binds, then reads
            sys.modules["vllm"] = parent
        sys.modules[ext_name] = ext
        module_name = f"dsv4sel.kernels._vllm_flashmla_interface_{len(_loaded)}"
        try:
            spec = importlib.util.spec_from_file_location(module_name, interface_path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module  # dataclasses look their module up while the class is built
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(module_name, None)
                raise
        finally:
            for name, value in saved.items():
                if value is _MISSING:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = value
        # the extension file it was loaded with, for FlashMLABuild.location (an attribute mypy cannot know)
        module.__dsv4sel_extension__ = ext_spec.origin  # type: ignore[attr-defined]
        _loaded[interface_path] = module
        return module


_MISSING = object()


def _vllm_build(tried: list[str]) -> FlashMLABuild | None:
    """vLLM's bundled FlashMLA: ``$DSV4SEL_VLLM_FLASHMLA_DIR``, else the installed vLLM; None (with ``tried``) if neither."""
    folder = os.environ.get(VLLM_FLASHMLA_DIR_ENV, "").strip()
    if folder:
        try:
            module = _check_interface(_load_bundle(_bundle_root(folder)), "vLLM's bundled FlashMLA")
            return FlashMLABuild("vllm-dir", module, module.__dsv4sel_extension__, None, "")
        except Exception as exc:  # noqa: BLE001 - loading a compiled extension and its module can raise anything
            tried.append(f"${VLLM_FLASHMLA_DIR_ENV}={folder} does not load ({type(exc).__name__}: {exc})")
    else:
        tried.append(f"${VLLM_FLASHMLA_DIR_ENV} is unset")

    real_vllm = sys.modules.get("vllm")
    if isinstance(real_vllm, types.ModuleType) and getattr(real_vllm, "__file__", None):
        try:  # vLLM is imported already: its own modules cost nothing more
            module = _check_interface(
                importlib.import_module("vllm.third_party.flashmla.flash_mla_interface"), "vLLM's bundled FlashMLA"
            )
            ext = sys.modules.get("vllm." + _EXTENSION)
            return FlashMLABuild("vllm", module, str(getattr(ext, "__file__", module.__file__)), _vllm_version(), "")
        except Exception as exc:  # noqa: BLE001 - importing a compiled extension can raise anything
            tried.append(f"vllm.third_party.flashmla does not import ({type(exc).__name__}: {exc})")
        return None
    vllm_dir = _vllm_package_dir()
    if vllm_dir is None:
        tried.append("vllm is not installed")
        return None
    try:
        module = _check_interface(_load_bundle(vllm_dir), "vLLM's bundled FlashMLA")
        return FlashMLABuild("vllm", module, module.__dsv4sel_extension__, _vllm_version(), "")
    except Exception as exc:  # noqa: BLE001 - loading a compiled extension and its module can raise anything
        tried.append(f"vLLM's bundled FlashMLA ({vllm_dir}) does not load ({type(exc).__name__}: {exc})")
    return None


def flashmla_build() -> FlashMLABuild:
    """The FlashMLA build the adapter uses here, loading it if needed. Never raises.

    Order: the ``flash_mla`` package, then ``$DSV4SEL_VLLM_FLASHMLA_DIR``, then the
    installed vLLM's bundled build. This is what ``dsv4sel doctor`` should call to
    name the FlashMLA in use (``flashmla_build().describe()``).
    """
    tried: list[str] = []
    try:
        module = _check_interface(importlib.import_module("flash_mla"), "flash_mla")
        return FlashMLABuild(
            "flash_mla", module, str(getattr(module, "__file__", "") or ""), getattr(module, "__version__", None), ""
        )
    except Exception as exc:  # noqa: BLE001 - importing the compiled flash_mla can raise anything
        tried.append(f"flash_mla is not importable ({type(exc).__name__}: {exc})")
    try:
        build = _vllm_build(tried)
    except Exception as exc:  # noqa: BLE001 - never raises (doctor calls it); find_spec runs every meta-path finder
        build = None
        tried.append(f"vLLM's bundled FlashMLA: {type(exc).__name__}: {exc}")
    return build if build is not None else FlashMLABuild("none", None, "", None, "; ".join(tried))


def load_flashmla() -> Any:
    """The interface module of :func:`flashmla_build`'s build; ImportError naming every try when none loads."""
    build = flashmla_build()
    if not build.found:
        raise ImportError(build.reason)
    return build.module


def load_vllm_flashmla() -> Any:
    """vLLM's bundled FlashMLA interface module only (registers ``torch.ops._flashmla_C``); ImportError if absent."""
    tried: list[str] = []
    build = _vllm_build(tried)
    if build is None:
        raise ImportError("; ".join(tried))
    return build.module
