"""Launching the codecs' Triton kernels with little host work per call (CUDA only).

A decode step writes a few dozen tokens per layer, so in eager mode a codec call costs what its
launch costs on the host. Triton's own path binds and specializes every argument in Python, then
its C launcher asks each tensor for ``data_ptr()`` and the driver for the pointer's attributes.
:class:`Launcher` does that once per specialization:

* a kernel's parameters are split in three: the *head* (the per-call tensors and ints: rows,
  slots, counts), the *tail* (:class:`Tail`: what belongs to one cache, its page pointers and
  sizes, resolved once per cache tensor to ints with their specialization) and the constexprs;
* the first launch of a specialization (argument dtypes, 16-byte alignment of pointers, ints
  equal to 1 or divisible by 16, int widths, constexprs: a superset of what Triton specializes on)
  goes through Triton, which compiles; its compiled kernel is kept, and later launches call the
  compiled kernel's C launcher directly with pointers as ints (Triton's launcher accepts an int
  for a pointer and then asks neither the tensor nor the driver).

With Triton's launch hooks installed (a profiler), or ``$DSV4SEL_TRITON_LAUNCHER=triton``, every
launch goes through Triton. A Triton whose launcher takes other arguments turns the direct path
off for the process (``STATE`` says why).

Importing this module imports triton and torch.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

__all__ = ["Launcher", "Tail", "LAUNCHER_ENV", "STATE", "spec"]

#: Set to "triton" to launch every kernel through Triton's own launch path.
LAUNCHER_ENV = "DSV4SEL_TRITON_LAUNCHER"
_Tensor = torch.Tensor


def spec(v: Any) -> Any:
    """What Triton specializes a non-constexpr argument on (a superset, so a key never merges two variants)."""
    cls = v.__class__
    if cls is int:
        return (v == 1, v % 16 == 0, -(1 << 31) <= v < (1 << 31))
    if cls is float or cls is bool or v is None:
        return cls
    return (v.dtype, v.data_ptr() % 16 == 0)


#: Each distinct tail specialization, numbered: a launch key holds the number (one int to hash).
_tail_tokens: dict[tuple, int] = {}


class Tail:
    """The arguments of one cache (after the head): tensors and ints, with the values the direct
    launch passes (pointers as ints) and their specialization, computed once (``token`` numbers
    the specialization, shared by every tail that has it)."""

    __slots__ = ("objects", "values", "key", "token")

    def __init__(self, *objects: Any) -> None:
        self.objects = objects
        self.values = tuple(o.data_ptr() if isinstance(o, _Tensor) else o for o in objects)
        self.key = tuple(map(spec, objects))
        self.token = _tail_tokens.setdefault(self.key, len(_tail_tokens))


def _setup() -> list:
    """[direct launches enabled, then why not], plus the device / stream / hook lookups."""
    global _current_device, _stream, _runtime
    try:
        from triton import knobs
        from triton.runtime import driver

        active = driver.active
        _current_device, _stream, _runtime = active.get_current_device, active.get_current_stream, knobs.runtime
        # torch's own getter of the current device (what Triton's calls, without its lazy-init check)
        _current_device = getattr(torch._C, "_cuda_getDevice", _current_device)
        enabled = os.environ.get(LAUNCHER_ENV, "").strip().lower() != "triton"
        return [enabled] if enabled else [False, f"${LAUNCHER_ENV}=triton"]
    # An older Triton lacks knobs / driver.active (ImportError, AttributeError); driver.active also
    # creates Triton's backend driver on first use, which can fail in any way: either way the kernels
    # keep Triton's own launch path, which reports a real fault itself.
    except Exception as exc:  # noqa: BLE001 - see above
        return [False, f"this Triton has no knobs / active driver ({type(exc).__name__})"]


_current_device: Any = None
_stream: Any = None
_runtime: Any = None
#: ``STATE[0]``: whether launches may take the direct path (tests and the benchmark flip it).
STATE = _setup()


def _hooked(hook: Any) -> bool:
    """Whether a launch hook knob holds a hook: Triton 3.6's knobs are HookChains (empty: no hook),
    older ones None or a function."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _direct_call(kernel: Any) -> "Callable[[int, int, tuple], None] | None":
    """``call(grid0, stream, args)`` launching ``kernel`` (a Triton CompiledKernel) through its C
    launcher, or None when this Triton's compiled kernels look different."""
    try:
        run = kernel.run  # CudaLauncher; loads the binary on first access
        function, packed = kernel.function, kernel.packed_metadata
        launch = run.launch
        no_scratch = not run.global_scratch_size and not run.profile_scratch_size
        coop, pdl = run.launch_cooperative_grid, run.launch_pdl
    except AttributeError:
        return None
    def through_launcher(grid0: int, stream: int, args: tuple) -> None:
        run(grid0, 1, 1, stream, function, packed, None, None, None, *args)

    def direct(grid0: int, stream: int, args: tuple) -> None:
        launch(grid0, 1, 1, stream, function, coop, pdl, None, None, packed, None, None, None, *args)

    # A kernel that needs scratch memory per launch goes through CudaLauncher, which allocates it.
    return direct if no_scratch else through_launcher


class Launcher:
    """A Triton kernel whose parameters are ``head + tail + constexprs``, launched by
    ``launcher(grid0, num_warps, head, tail, consts)`` (see the module docstring)."""

    def __init__(self, fn: Any, head: int) -> None:
        self.fn = fn
        self.head = head
        self.variants: dict[Any, Any] = {}
        self.calls = 255  # the first call looks Triton's launch hooks up, then every 256th
        self.hooked = False
        self.fast = 0  # launches that took the direct path (the benchmark reports it)

    def __call__(self, grid0: int, num_warps: int, head: tuple, tail: Tail, consts: tuple) -> None:
        assert len(head) == self.head
        if not STATE[0]:
            self.fn[(grid0,)](*head, *tail.objects, *consts, num_warps=num_warps)
            return
        self.calls += 1
        if not self.calls & 255:
            self._look()
        device = _current_device()
        key, values = _key(device, num_warps, head, tail, consts)
        call = self.variants.get(key)
        if call is not None and not self.hooked:
            try:
                call(grid0, _stream(device), (*values, *tail.values, *consts))
                self.fast += 1
                return
            except TypeError as exc:  # this Triton's launcher takes other arguments: its own path from now on
                STATE[0] = False
                STATE.append(f"disabled: {exc}")
        kernel = self.fn[(grid0,)](*head, *tail.objects, *consts, num_warps=num_warps)
        if call is None and kernel is not None:
            made = _direct_call(kernel)
            if made is not None:
                self.variants[key] = made

    def _look(self) -> None:
        """Whether Triton's launch hooks are set (a profiler): then launches take Triton's path."""
        self.hooked = _hooked(_runtime.launch_enter_hook) or _hooked(_runtime.launch_exit_hook)

    def bind(self, grid0: int, num_warps: int, head: tuple, tail: Tail, consts: tuple,
             per_call: int = 1) -> "Callable[..., bool] | None":
        """This launch with the head's first ``per_call`` entries (1 to 3 tensors) given per call as pointers.

        ``launch(*ptrs)`` launches on the current stream and returns True, or launches nothing and
        returns False where the direct path does not apply (off, hooked, a pointer not 16-byte aligned
        as the example's are, another current device); the caller then launches through ``__call__``.
        The caller guarantees that the tensors have the examples' dtypes. ``bind`` itself launches twice
        with ``head`` (Triton compiles, then the direct path is tried), so those arguments must be
        harmless to run. None where the direct path is off or an example is not aligned."""
        assert 1 <= per_call <= 3
        for _ in range(2):
            self(grid0, num_warps, head, tail, consts)
        if not STATE[0]:
            return None
        device = _current_device()
        key, values = _key(device, num_warps, head, tail, consts)
        call = self.variants.get(key)
        if call is None or any(v & 15 for v in values[:per_call]):
            return None
        after = (*values[per_call:], *tail.values, *consts)

        # One closure per arity, the checks inline: they are most of the Python left per launch.
        def launch1(p: int) -> bool:
            self.calls += 1
            if not self.calls & 255:
                self._look()
            if p & 15 or self.hooked or not STATE[0] or _current_device() != device:
                return False
            call(grid0, _stream(device), (p, *after))
            self.fast += 1
            return True

        def launch2(p: int, r: int) -> bool:
            self.calls += 1
            if not self.calls & 255:
                self._look()
            if (p | r) & 15 or self.hooked or not STATE[0] or _current_device() != device:
                return False
            call(grid0, _stream(device), (p, r, *after))
            self.fast += 1
            return True

        def launch3(p: int, r: int, t: int) -> bool:
            self.calls += 1
            if not self.calls & 255:
                self._look()
            if (p | r | t) & 15 or self.hooked or not STATE[0] or _current_device() != device:
                return False
            call(grid0, _stream(device), (p, r, t, *after))
            self.fast += 1
            return True

        return (launch1, launch2, launch3)[per_call - 1]


def _key(device: int, num_warps: int, head: tuple, tail: Tail, consts: tuple) -> tuple[tuple, list]:
    """A launch's specialization key and the head's values (pointers as ints). Flat, with the tail's
    specialization as its number: building and hashing the key is most of a direct launch's Python."""
    values: list = []
    key: list = [device, num_warps, tail.token, consts]
    for v in head:  # one pass: a tensor's pointer is asked for once
        cls = v.__class__
        if cls is _Tensor:
            ptr = v.data_ptr()
            values.append(ptr)
            key.append(v.dtype)
            key.append(not ptr & 15)
        elif cls is int:
            values.append(v)
            key.append(v == 1)
            key.append(not v & 15)
            key.append(-0x80000000 <= v < 0x80000000)
        else:
            values.append(v)
            key.append(spec(v))
    return tuple(key), values
