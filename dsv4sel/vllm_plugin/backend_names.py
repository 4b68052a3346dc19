"""How a rule pack's backend name reaches the rules through vLLM 0.33's ``--attention-backend``.

vLLM turns the name into a member of ``AttentionBackendEnum`` in one place,
``_AttentionBackendEnumMeta.__getitem__`` (``AttentionBackendEnum[NAME]``), which both ways in call:
``AttentionConfig(backend=NAME)`` (its pydantic ``validate_backend_before``) and ``vllm serve
--attention-backend NAME`` (``EngineArgs.create_engine_config`` calls the same validator directly and
assigns the member to a copied config, so ``AttentionConfig.__post_init__`` never runs on that way).
An unknown name is a ValueError there ("Unknown attention backend"), before anything decides.

The plugin replaces that ``__getitem__``: a name vLLM lacks that the loaded rules can select (a pack's
``B12X_MLA_SPARSE``, or dsv4sel's ``CPU_V4_MLA_SPARSE``) becomes a member through vLLM's own
``AttentionBackendEnum.register`` (what ``register_backend("NAME", path)`` does), so the name travels
as the member itself (``attention_config.backend.name``) to the selection functions, which read it.
Any other unknown name is still vLLM's ValueError, with the rules' suggestion added.

Python pickles an enum member by value, and a spawned engine process unpickles its ``VllmConfig``
before it loads plugins, where a registered member's value means nothing: each member registered here
pickles as a call of :func:`member` (by name), which registers it again in the receiving process.

The value of a registered member is ``dsv4sel:NAME``, not a class path: vLLM's generic attention
selector (``backend.get_class()``) has no class for a DeepSeek-V4 backend; the plugin refuses such a
name for a model that is not DeepSeek-V4 when vLLM validates its config (:func:`registered_here`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: The prefix of a registered member's value: ``dsv4sel:B12X_MLA_SPARSE``.
VALUE_PREFIX = "dsv4sel:"
#: The names registered in this process, in order (``uninstall`` takes them out again).
_registered: list[str] = []


def _enum() -> Any:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum


def member(name: str) -> Any:
    """The member of vLLM's ``AttentionBackendEnum`` named ``name``, registered (through vLLM's
    ``AttentionBackendEnum.register``) when vLLM lacks it. Also what unpickling a registered member
    calls, in any process."""
    enum = _enum()
    found = enum._member_map_.get(name)
    if found is not None:
        return found
    found = enum.register(name, VALUE_PREFIX + name)
    if found is None:  # vLLM 0.33's register() builds the member but returns nothing
        found = enum._member_map_[name]
    # a member pickles by value; this one pickles by name, through this function
    object.__setattr__(found, "__reduce_ex__", lambda proto, _name=name: (member, (_name,)))
    _registered.append(name)
    return found


def registered_here(backend: Any) -> bool:
    """True when ``backend`` (an enum member or None) is a name this plugin registered."""
    value = getattr(backend, "value", None)
    return isinstance(value, str) and value.startswith(VALUE_PREFIX)


def _suggestion(name: str, rules_of: Callable[[], Any], platform: str) -> str | None:
    """The rules' refusal of an unknown backend name (with its "did you mean"), or None when the
    rules know the name (then vLLM's own message is the whole story)."""
    from ..errors import SelectionError

    try:
        rules_of().normalize(platform=platform, backend=name)
    except SelectionError as exc:
        return str(exc).splitlines()[0]
    except Exception:  # noqa: BLE001 - a suggestion must never replace vLLM's own refusal
        return None
    return None


def make_getitem(original: Callable, rules_of: Callable[[], Any], platform: Callable[[], str]) -> Callable:
    """``_AttentionBackendEnumMeta.__getitem__`` for the plugin: vLLM's, then a name the loaded rules
    can select is registered; any other unknown name is vLLM's ValueError with the rules' words."""

    def __getitem__(cls, name):
        try:
            return original(cls, name)
        except ValueError as exc:
            if cls is not _enum() or not isinstance(name, str):
                raise
            known = _selectable(rules_of, name)
            if known is True:
                return member(name)
            words = None if known is None else _suggestion(name, rules_of, platform())
            if words is None:
                raise
            raise ValueError(f"{exc} (dsv4sel: {words})") from None

    setattr(__getitem__, "__wrapped_vllm__", original)  # noqa: B010 - uninstall and readers use it
    return __getitem__


def _selectable(rules_of: Callable[[], Any], name: str) -> bool | None:
    """True when the loaded rules can select backend ``name``, False when they cannot, None when the
    rules cannot be read here (the decision at config time then reports why)."""
    try:
        rules = rules_of()
    except Exception:  # noqa: BLE001 - a broken pack is reported when vLLM validates a DeepSeek-V4 config
        return None
    return name in rules.selectable_backends


def forget() -> None:
    """Take every member registered here out of vLLM's enum again (for tests: ``uninstall``)."""
    if not _registered:
        return
    enum = _enum()
    for name in _registered:
        found = enum._member_map_.pop(name, None)
        if found is not None:
            enum._value2member_map_.pop(found._value_, None)
            if name in enum._member_names_:
                enum._member_names_.remove(name)
            try:
                type.__delattr__(enum, name)
            except AttributeError:
                pass
    _registered.clear()
