"""What the plugin reads of vLLM in every release (data only; nothing here imports vLLM): its host
name, the attribute it leaves on ``AttentionConfig``, and the release folder wired for the
installed vLLM (``v0_33/``, ``v0_34/``: what differs by release)."""

from __future__ import annotations

from types import ModuleType

from ..dsv4.host_registry import HOSTS
from .state import _state

HOST = "vllm"
#: vLLM versions this plugin's release folders are written for (the host registry's releases).
SUPPORTED = HOSTS[HOST].supported
#: Attribute the patched ``AttentionConfig.__post_init__`` leaves on the config: the backend the
#: user named, before vLLM erases ``CUTLASS_MSA`` / ``TRITON_MSA`` (MiniMax aliases) to None.
REQUESTED = "_dsv4sel_requested_backend"


def release() -> ModuleType:
    """The release folder wired by ``install()``; before that (a reader used on its own), the one
    for the installed vLLM, else the newest."""
    import importlib

    wired = _state.get("release")
    if wired is not None:
        return wired
    host, version = HOSTS[HOST], None
    try:
        import vllm

        version = getattr(vllm, "__version__", None)
    except ImportError:
        pass
    found = None
    if isinstance(version, str):
        try:
            found = host.release_for(version)
        except ValueError:
            found = None
    return importlib.import_module((found or host.releases[-1]).package)

