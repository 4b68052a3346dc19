"""The class side of an impl: where its kernel runs, how its library is imported, and
the hooks a subclass must write, checked when the class is defined.

:class:`ImplClass` is the base of :class:`dsv4sel.kernels.base.SparseMLAImpl`; it
holds everything ``is_available()`` needs (no instance, no torch import). The
extension API, i.e. the methods an impl (a shipped one or a rule pack's) writes,
is listed in :data:`HOOKS` and documented in ``docs/kernels.md`` ("Writing an impl").

This module imports neither torch nor a kernel library.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from .platform import Capability, detect_platform, format_capability, parse_capability

__all__ = ["HOOKS", "REQUIRED_HOOKS", "ImplClass", "library_label", "missing_hooks", "writes_hook"]

#: Every method of the extension API, with its signature as the errors name it.
#: ``required`` ones have no usable default; the others default to "nothing to do".
HOOKS: Mapping[str, str] = {
    "import_library": "import_library(cls) -> module   (a classmethod: import and return the kernel's module)",
    "library_missing_reason": "library_missing_reason(cls, exc) -> str   (optional classmethod: what to install)",
    "run_library": ("run_library(self, plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink) "
                    "-> DecodeOutput   (call the kernel for one layer)"),
    "plan_library": "plan_library(self, plan) -> None   (optional: fill plan.state once per batch shape)",
    "replan_library": "replan_library(self, plan) -> None   (optional: refresh plan.state after new lengths)",
    "prefill_library": ("prefill_library(self, plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink) "
                        "-> DecodeOutput   (optional: the sparse prefill, every query token its own row; without "
                        "it a host runs its own prefill kernel)"),
    "entry_point_reason": "entry_point_reason(cls, module, capability) -> str | None   (optional classmethod)",
    "target_reason": "target_reason(cls, platform, capability) -> str | None   (optional classmethod; default reads targets)",
    "library_label": "library_label(cls, module) -> str   (optional classmethod)",
}
REQUIRED_HOOKS: tuple[str, ...] = ("import_library", "run_library")
#: Names earlier releases (and their docs) used, each with the hook that replaced it: a class
#: defining one would never be called, so defining it is an error naming the method to write.
_RENAMED: Mapping[str, str] = {
    "_forward_library": "run_library",
    "_run_library": "run_library",
    "_plan_library": "plan_library",
    "_replan_library": "replan_library",
    "_import_library": "import_library",
    "_library_missing_reason": "library_missing_reason",
    "_entry_point_reason": "entry_point_reason",
    "_target_reason": "target_reason",
    "_library_label": "library_label",
}
#: The published page (a wheel has no docs/ folder); the kernels import nothing of the core, so the
#: URL is dsv4sel._version.DOCS_URL written out (tests/product/test_packaging.py holds them equal).
_DOCS = "https://github.com/dsv4sel/dsv4sel/blob/main/docs/kernels.md, 'Writing an impl'"
#: The modules whose classes define only the hooks' defaults (:func:`writes_hook` skips them).
_BASE_MODULES = frozenset({__name__, __name__.rpartition(".")[0] + ".base"})

#: How the "cannot run here" reasons name each platform's hardware and its capability.
_PLATFORM_HARDWARE = {"cuda": "NVIDIA GPUs", "rocm": "AMD GPUs", "xpu": "Intel GPUs"}
_CAPABILITY_WORDS = {"cuda": "CUDA compute capability", "rocm": "ROCm GPU architecture"}


def _defined_by(cls: type, name: str) -> type | None:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass
    return None


def writes_hook(cls: type, name: str) -> bool:
    """Whether ``cls`` (or a class between it and :class:`ImplClass`'s subclasses in this package)
    writes the optional hook ``name`` itself, e.g. ``prefill_library``: a host asks before it hands
    its prefill to the impl. The bases of this package (``ImplClass``, ``SparseMLAImpl``) do not count."""
    owner = _defined_by(cls, name)
    return owner is not None and owner.__module__ not in _BASE_MODULES


def missing_hooks(cls: type) -> list[str]:
    """The required hooks ``cls`` inherits only from :class:`ImplClass` (i.e. never wrote)."""
    return [name for name in REQUIRED_HOOKS if _defined_by(cls, name) is ImplClass]


def _missing_message(cls: type, names: list[str]) -> str:
    wanted = "; ".join(HOOKS[name] for name in names)
    return f"{cls.__name__} must implement {', '.join(names)}: {wanted} (see {_DOCS})"


def library_label(name: str, module: Any) -> str:
    """A library's name and its module's ``__version__`` (when it has one), as availability reasons say it."""
    version = getattr(module, "__version__", None)
    return f"{name}{' ' + str(version) if version else ''}"


class ImplClass:
    """Availability and the hook contract of an impl class (the base of ``SparseMLAImpl``).

    Class attributes a subclass sets: ``impl_name``, ``library_name``,
    ``supported_layouts``, ``targets``, ``kernel_label``, ``built_for``,
    ``other_gpu_hint``. Hooks: :data:`HOOKS`; the required ones
    (:data:`REQUIRED_HOOKS`) are checked when a subclass is defined: a class that
    lacks one raises TypeError naming the method to write, unless it is declared
    ``class Base(SparseMLAImpl, abstract=True)`` (a base for other impls), and a
    class defining a method under a name the base class never calls (such as
    ``_forward_library``) raises TypeError naming the hook that replaced it.
    ``is_available()`` answers False with the same message for a class that
    escaped the check.
    """

    impl_name: ClassVar[str] = "SparseMLAImpl"
    #: The importable module the impl calls (for messages).
    library_name: ClassVar[str] = ""
    #: Layout names the impl can read on at least one GPU generation.
    supported_layouts: ClassVar[frozenset[str]] = frozenset()
    #: Where the kernel runs: platform -> the GPU generations it is built for,
    #: each a major (``9`` is every SM9x) or an exact ``(major, minor)``
    #: (``(9, 4)`` is gfx942). None: every platform and capability torch runs on.
    targets: ClassVar[Mapping[str, frozenset] | None] = None
    #: The kernel as the "cannot run here" reasons name it, e.g. "FlashMLA sparse decode".
    kernel_label: ClassVar[str] = ""
    #: What the kernel needs, completing "<kernel_label> ...", e.g. "is built for SM90 and SM100".
    built_for: ClassVar[str] = ""
    #: Added after "this GPU is X.Y" on a GPU it is not built for, e.g. " (on SM90 use FlashMLA)".
    other_gpu_hint: ClassVar[str] = ""

    def __init_subclass__(cls, abstract: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for old, new in _RENAMED.items():
            if old in cls.__dict__:
                raise TypeError(
                    f"{cls.__name__} defines {old}, which SparseMLAImpl never calls: implement {HOOKS[new]} "
                    f"instead (see {_DOCS})"
                )
        if not abstract:
            missing = missing_hooks(cls)
            if missing:
                raise TypeError(_missing_message(cls, missing))

    # -- hooks with a default --------------------------------------------
    @classmethod
    def target_reason(cls, platform: str, capability: Capability | None) -> str | None:
        """Why the impl cannot run on this target, or None if it can: read from
        :attr:`targets` (override it only for a rule no table says)."""
        if cls.targets is None:
            return None
        if platform not in cls.targets:
            where = ", ".join(f"{_PLATFORM_HARDWARE.get(p, p)} (platform {p})" for p in cls.targets)
            return f"{cls.kernel_label} runs on {where}, not {platform}"
        if capability is None:
            return f"no {_CAPABILITY_WORDS.get(platform, platform + ' capability')} known; {cls.kernel_label} {cls.built_for}"
        generations = cls.targets[platform]
        if capability[0] not in generations and tuple(capability) not in generations:
            return f"{cls.kernel_label} {cls.built_for}; this GPU is {format_capability(capability)}{cls.other_gpu_hint}"
        return None

    @classmethod
    def entry_point_reason(cls, module: Any, capability: Capability | None) -> str | None:
        """Why the imported ``module`` cannot serve ``capability``, or None if it can.

        For entry points whose required arguments depend on the GPU generation
        (e.g. a keyword only newer library releases accept). Never raises.
        """
        return None

    @classmethod
    def library_label(cls, module: Any) -> str:
        """How ``is_available`` names the imported library (name and version)."""
        return library_label(cls.library_name, module)

    # -- required hooks (defaults only raise) ----------------------------
    @classmethod
    def import_library(cls) -> Any:
        """Import and return the kernel entry point's module (may raise anything)."""
        raise NotImplementedError(_missing_message(cls, ["import_library"]))

    def run_library(self, plan: Any, q: Any, kv_cache: Any, indices: Any, extra_kv_cache: Any,
                    extra_indices: Any, attn_sink: Any) -> Any:
        """Call the kernel for one layer with ``plan`` (see ``SparseMLAImpl``)."""
        raise NotImplementedError(_missing_message(type(self), ["run_library"]))

    # -- optional hooks, continued ---------------------------------------
    @classmethod
    def library_missing_reason(cls, exc: BaseException) -> str:
        """The message for a failed import: what to install (default: the import error)."""
        return f"{cls.library_name or cls.__name__} is not importable ({type(exc).__name__}: {exc})"

    # -- availability ----------------------------------------------------
    @classmethod
    def _library(cls) -> tuple[Any, str | None]:
        """``(module, None)`` or ``(None, reason)``; never raises."""
        try:
            return cls.import_library(), None
        except Exception as exc:  # noqa: BLE001 - import_library may raise anything (a broken build: OSError, ...)
            return None, cls.library_missing_reason(exc)

    @classmethod
    def is_available(cls, platform: str | None = None, capability: Any = None) -> tuple[bool, str]:
        """Can this impl run on (platform, capability)? ``None`` = this machine. Never raises."""
        try:
            missing = missing_hooks(cls)
            if missing:
                return False, _missing_message(cls, missing)
            if platform is None:
                detected, detected_cap = detect_platform()
                platform = detected
                if capability is None:
                    capability = detected_cap
            cap = parse_capability(capability)
            reason = cls.target_reason(platform, cap)
            if reason is not None:
                return False, reason
            module, reason = cls._library()
            if reason is None:
                reason = cls.entry_point_reason(module, cap)
            if reason is not None:
                return False, reason
            where = f"{platform}" + (f" {cap[0]}.{cap[1]}" if cap else "")
            return True, f"{cls.library_label(module)} importable; {where} supported"
        except Exception as exc:  # noqa: BLE001 - never raises: an adapter hook's bug is a reason, not a crash
            return False, f"availability check failed: {type(exc).__name__}: {exc}"
