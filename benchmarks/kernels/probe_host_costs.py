# ruff: noqa: B023 - every lambda is called inside the iteration that made it
"""Host costs of the small eager calls (issue 21): what a 64-token read and a padded-head ``run`` spend.

    python benchmarks/kernels/probe_host_costs.py [--json out.json]

Each figure is wall time per call over back-to-back calls, then one synchronize (so the larger of
host and GPU time per call), median of ``--rounds`` rounds; ``graph`` figures are CUDA-event time per
call of a CUDA graph of 20 calls. Sections: allocation and view ops, the codecs' 64-token read taken
apart, and FlashMLA's ``run`` at b = 4, h = 16 (padded to 64) calling the op directly (the eager replay
turned off: ``probe_eager_graph.py`` times it) with each way of copying ``q`` into the padded buffer
(Triton kernel, torch ``copy_``, ``cudaMemcpy2DAsync``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import types

import torch
from _timing import dump, machine

from dsv4sel.kernels import triton_codecs, triton_launch
from dsv4sel.kernels.codec_support import cache_info, check_slots
from dsv4sel.kernels.layouts import LAYOUTS

RESULTS: dict = {}


SCALE = 512**-0.5


def flashmla_setup(lib, batch, heads, copies=4):
    """``(impl, layers, topk_length, extra_topk_length, raw, counter)`` for FlashMLA at one shape:
    ``copies`` layers (fp8_ds_mla caches, top-k WINDOW + TOPK), and ``raw(q=None)``, the raw interface
    call over the next layer (q and sink padded to 64 heads once, outside the timing; ``q``, a padded
    query of the same shape, stands in for the layer's; ``counter[0]`` is the layer index it and the
    caller's own callables cycle through), called once."""
    from bench_flashmla_plan_run import BLOCK, TOPK, WINDOW, make_layer

    from dsv4sel.kernels.flashmla import DeepseekV4FlashMLASparseImpl

    gen = torch.Generator().manual_seed(batch * 1000 + heads)
    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", BLOCK)
    layers = [make_layer(impl, batch, heads, gen, "cuda") for _ in range(copies)]
    tl_ = torch.full((batch,), WINDOW, dtype=torch.int32, device="cuda")
    etl = torch.randint(256, TOPK + 1, (batch,), generator=gen, dtype=torch.int32).to("cuda")
    pages = [(impl._pages(la["kv_cache"]), impl._pages(la["extra_kv_cache"])) for la in layers]
    h_pad = max(heads, 64)
    sinks = [torch.nn.functional.pad(la["attn_sink"].float(), (0, h_pad - heads)).contiguous() for la in layers]
    raw_q = [torch.nn.functional.pad(la["q"], (0, 0, 0, h_pad - heads)).contiguous() for la in layers]
    meta = lib.get_mla_metadata()[0]
    counter = [0]

    def raw(q=None):
        i = counter[0] = (counter[0] + 1) % copies
        la, (kc, ec) = layers[i], pages[i]
        return lib.flash_mla_with_kvcache(raw_q[i] if q is None else q, kc, None, None, 512, meta, num_splits=None, softmax_scale=SCALE,
                                          causal=False, is_fp8_kvcache=True, indices=la["indices"],
                                          attn_sink=sinks[i], extra_k_cache=ec,
                                          extra_indices_in_kvcache=la["extra_indices"], topk_length=tl_,
                                          extra_topk_length=etl)

    raw()
    return impl, layers, tl_, etl, raw, counter


def wall(fn, calls=400, rounds=7):
    """Median µs per call of ``calls`` back-to-back calls (then one sync), over ``rounds`` rounds."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def graph_us(fn, calls=20, rounds=7):
    """CUDA-event µs per call of a graph of ``calls`` calls of ``fn``."""
    fn()
    torch.cuda.synchronize()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def record(section, name, value):
    RESULTS.setdefault(section, {})[name] = value
    print(f"{section:>6} | {name:<58} | {value:8.2f}", flush=True)


def section(name, fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - report and go on: one broken probe must not cost the call
        import traceback

        print(f"{name}: FAILED {type(exc).__name__}: {exc}")
        traceback.print_exc()


# -- allocation and views ----------------------------------------------------
def basics():
    dev = torch.device("cuda", 0)
    slots = torch.zeros(64, dtype=torch.int64, device=dev)
    x = torch.empty(64, 512, dtype=torch.bfloat16, device=dev)
    bf = torch.bfloat16
    record("basic", "torch.empty((64,512), dtype, device=torch.device)", wall(lambda: torch.empty((64, 512), dtype=bf, device=dev)))
    record("basic", "torch.empty((64,512), dtype, device=0)", wall(lambda: torch.empty((64, 512), dtype=bf, device=0)))
    record("basic", "slots.new_empty((64,512), dtype=bf16)", wall(lambda: slots.new_empty((64, 512), dtype=bf)))
    record("basic", "x.new_empty((64,512))", wall(lambda: x.new_empty((64, 512))))
    record("basic", "torch.empty_like(x)", wall(lambda: torch.empty_like(x)))
    record("basic", "x.zero_() (one launch)", wall(lambda: x.zero_()))
    lse = torch.empty(4, 64, 1, device=dev)
    out = torch.empty(4, 1, 64, 512, dtype=bf, device=dev)
    record("basic", "lse.as_strided((4,1,16),(64,1,1))", wall(lambda: lse.as_strided((4, 1, 16), (64, 1, 1))))
    record("basic", "lse.transpose(1, 2)", wall(lambda: lse.transpose(1, 2)))
    record("basic", "lse.mT", wall(lambda: lse.mT))
    record("basic", "out.narrow(2, 0, 16)", wall(lambda: out.narrow(2, 0, 16)))
    record("basic", "out.as_strided(4d)", wall(lambda: out.as_strided((4, 1, 16, 512), (32768, 32768, 512, 1))))
    record("basic", "out[:, :, :16]", wall(lambda: out[:, :, :16]))
    cd, st = triton_launch._current_device, triton_launch._stream
    record("basic", "triton current_device()", wall(cd, calls=2000))
    record("basic", "triton get_current_stream(0)", wall(lambda: st(0), calls=2000))
    record("basic", "torch._C._cuda_getDevice()", wall(torch._C._cuda_getDevice, calls=2000))
    record("basic", "torch._C._cuda_getCurrentRawStream(0)", wall(lambda: torch._C._cuda_getCurrentRawStream(0), calls=2000))
    record("basic", "x.data_ptr()", wall(x.data_ptr, calls=2000))
    record("basic", "torch.cuda.is_current_stream_capturing()", wall(torch.cuda.is_current_stream_capturing, calls=2000))


# -- the 64-token read, taken apart ------------------------------------------
def reads():
    gen = torch.Generator().manual_seed(2)
    for name in ("fp8_ds_mla", "bf16_row", "fp8_e4m3_row"):
        read_one(name, gen)
        torch.cuda.empty_cache()


def read_one(name, gen):
    if True:
        layout = LAYOUTS[name]
        cache = layout.allocate(1 << 14, 64, device="cuda")
        kv = torch.randn(64, 512, generator=gen).to(torch.bfloat16).cuda()
        slots = torch.randperm(1 << 20, generator=gen)[:64].cuda()
        layout.write(cache, kv, slots)
        record("read", f"{name}: write default", wall(lambda: layout.write(cache, kv, slots)))
        record("read", f"{name}: read default", wall(lambda: layout.read(cache, slots)))
        record("read", f"{name}: read check=False", wall(lambda: layout.read(cache, slots, check=False)))
        record("read", f"{name}: cache_info + check_slots", wall(lambda: check_slots(slots, None, cache_info(layout, cache), True)))
        out = torch.empty(64, 512, dtype=torch.bfloat16, device="cuda")
        if name == "fp8_ds_mla":
            c = triton_codecs._args(cache, cache.shape[0] * 64)
            rest, flags, launcher, (tokens, warps) = (64, cache.shape[1]), (), triton_codecs._read_ds, triton_codecs._DSMLA_READ
        else:
            c = triton_codecs._args(cache, cache.shape[0] * cache.shape[1])
            scale = layout._fused_scale()
            rest, flags = (float(scale or 1.0),), triton_codecs._row_flags(scale)
            launcher, tokens, warps = triton_codecs._read_rows, triton_codecs._READ_TOKENS, triton_codecs._READ_WARPS
        tail = c.tail((launcher, True, rest), *rest, check=True, scratch=None)
        consts = (*flags, True, tokens)
        record("read", f"{name}: launcher only (out preallocated)", wall(lambda: launcher(-(-64 // tokens), warps, (out, slots, 64), tail, consts)))
        record("read", f"{name}: read default, graph (GPU µs)", graph_us(lambda: layout.read(cache, slots)))
        record("read", f"{name}: write default, graph (GPU µs)", graph_us(lambda: layout.write(cache, kv, slots)))
        # again, interleaved with the others' order effects
        record("read", f"{name}: read default (again)", wall(lambda: layout.read(cache, slots)))


# -- cudaMemcpy2DAsync through ctypes ------------------------------------------
def cudart():
    import ctypes

    paths = []
    with open("/proc/self/maps") as fh:
        for line in fh:
            if "libcudart" in line:
                paths.append(line.split()[-1])
    for name in [*paths, "libcudart.so.13", "libcudart.so.12", "libcudart.so"]:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        fn = lib.cudaMemcpy2DAsync
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                       ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        print(f"cudart: {name}")
        return fn
    raise OSError("no libcudart")


def memcpy2d_copier(fn):
    raw_stream = torch._C._cuda_getCurrentRawStream

    def copy(q, buf):
        b, s, h, cols = q.shape
        rc = fn(buf.data_ptr(), buf.shape[2] * cols * 2, q.data_ptr(), h * cols * 2, h * cols * 2, b * s, 3,
                raw_stream(buf.get_device()))
        if rc:
            raise RuntimeError(f"cudaMemcpy2DAsync: {rc}")
        return True

    return copy


# -- FlashMLA run at b = 4, h = 16 ---------------------------------------------
def flashmla():
    from bench_flashmla_plan_run import TOPK, WINDOW

    from dsv4sel.kernels import triton_heads
    from dsv4sel.kernels.flashmla import DeepseekV4FlashMLASparseImpl, flashmla_build
    from dsv4sel.kernels.flashmla_replay import REPLAY_ENV

    ok, why = DeepseekV4FlashMLASparseImpl.is_available()
    if not ok:
        print("FlashMLA:", why)
        return
    lib = flashmla_build().module
    for batch, heads in ((4, 16), (4, 64)):
        impl, layers, tl_, etl, raw, counter = flashmla_setup(lib, batch, heads)
        # the op called directly: these are the costs of that path (probe_eager_graph.py times the replay)
        os.environ[REPLAY_ENV] = "off"
        try:
            plan = impl.plan(batch=batch, heads=heads, topk=WINDOW, extra_topk=TOPK, softmax_scale=SCALE,
                             topk_length=tl_, extra_topk_length=etl)
        finally:
            del os.environ[REPLAY_ENV]

        def run():
            i = counter[0] = (counter[0] + 1) & 3
            return impl.run(**layers[i], plan=plan)

        tag = f"b{batch}h{heads}"
        variants = {"raw": raw, "run": run}
        st = plan.state
        if plan.query_buffer is not None:
            qbuf = plan.query_buffer

            def run_qbuf():
                i = counter[0] = (counter[0] + 1) & 3
                return impl.run(**{**layers[i], "q": qbuf}, plan=plan)

            variants["run, q in query_buffer"] = run_qbuf
        bound = plan.fast_run

        def run_general():
            plan.fast_run = None
            try:
                return run()
            finally:
                plan.fast_run = bound

        variants["run, general path"] = run_general
        copiers = {"triton (current)": st.get("copy_heads"), "torch copy_": None}
        try:
            copiers["cudaMemcpy2DAsync"] = memcpy2d_copier(cudart())
        except Exception as exc:  # noqa: BLE001
            print("memcpy2d:", exc)
        for rnd in range(3):
            for name, fn in variants.items():
                record("fmla", f"{tag} {name} (round {rnd})", wall(fn, calls=240))
            if st.get("padded"):
                for cname, copier in copiers.items():
                    st["copy_heads"] = copier
                    record("fmla", f"{tag} run general path, copy by {cname} (round {rnd})", wall(run_general, calls=240))
                st["copy_heads"] = copiers["triton (current)"]
        if st.get("padded"):
            q, buf, live = layers[0]["q"], st["q_buf"], st["q_live"]
            for cname, copier in copiers.items():
                fn = (lambda: live.copy_(q)) if copier is None else (lambda c=copier: c(q, buf))
                record("fmla", f"{tag} copy alone: {cname}", wall(fn, calls=1000))
                record("fmla", f"{tag} copy alone: {cname}, graph (GPU µs)", graph_us(fn))
                fn()
                torch.cuda.synchronize()
                ok = torch.equal(buf[:, :, :heads], q) and not buf[:, :, heads:].any()
                print(f"  {cname}: copy exact {ok}")
            # the Triton direct call with nothing around it (the floor of that path)
            call = next(iter(triton_heads._copy.variants.values()))
            tail = triton_heads._tails[id(buf)][1]
            ss, sh = q.stride(1), q.stride(2)
            stream = triton_launch._stream
            record("fmla", f"{tag} copy alone: bare Triton C launch",
                   wall(lambda: call(batch * heads, stream(0), (q.data_ptr(), ss, sh, heads, *tail.values, 512)), calls=1000))
            # graph: run with each copier
            counter[0] = 0
            record("fmla", f"{tag} run graph, bound path (GPU µs)", graph_us(run))
            fast_copy = st["fast_copy"]
            record("fmla", f"{tag} copy alone: bound launch", wall(lambda: fast_copy(q.data_ptr()), calls=1000))
            for cname, copier in copiers.items():
                st["copy_heads"] = copier
                counter[0] = 0
                try:
                    record("fmla", f"{tag} run graph, general path, copy by {cname} (GPU µs)", graph_us(run_general))
                except Exception as exc:  # noqa: BLE001
                    print(f"  graph with {cname}: {type(exc).__name__}: {exc}")
            st["copy_heads"] = copiers["triton (current)"]
            record("fmla", f"{tag} raw graph (GPU µs)", graph_us(raw))
        # run's own host work: the op replaced by a stub returning ready tensors
        outs = st["op"](*_op_args(impl, plan, layers[0])) if st.get("op") is not None else None
        if outs is not None:
            from dsv4sel.kernels.flashmla import _query
            from dsv4sel.kernels.flashmla_fast import fast_run

            real = st["op"]
            st["op"] = lambda *a: outs
            plan.fast_run = fast_run(plan, _query)
            record("fmla", f"{tag} run with a stub op (run's own host work)", wall(run, calls=1000))
            record("fmla", f"{tag} run with a stub op, general path", wall(run_general, calls=1000))
            st["op"] = real
            plan.fast_run = bound
            saved = lib.flash_mla_cuda
            lib.flash_mla_cuda = types.SimpleNamespace(sparse_decode_fwd=lambda *a: outs)
            try:
                record("fmla", f"{tag} raw with a stub op (interface's own host work)", wall(raw, calls=1000))
            finally:
                lib.flash_mla_cuda = saved
            record("fmla", f"{tag} the op alone (planned args)", wall(lambda: real(*_op_args(impl, plan, layers[0])), calls=400))


def _op_args(impl, plan, layer):
    st = plan.state
    q = st["q_buf"] if st["padded"] else layer["q"]
    sink = impl._sink(st, layer["attn_sink"], plan.device)
    meta = st["meta"]
    return (q, impl._page_view(layer["kv_cache"], plan.block_size, "c"), layer["indices"], plan.topk_length, sink,
            meta.tile_scheduler_metadata, meta.num_splits, impl._page_view(layer["extra_kv_cache"], plan.block_size, "e"),
            layer["extra_indices"], plan.extra_topk_length, 512, plan.softmax_scale, None, False)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", default=None)
    parser.add_argument("--skip", default="")
    args = parser.parse_args()
    print(f"# {machine('cuda')}; launcher {triton_launch.STATE}")
    for name, fn in (("basics", basics), ("reads", reads), ("flashmla", flashmla)):
        if name not in args.skip:
            section(name, fn)
    dump(args.json, {"machine": machine("cuda"), "results": RESULTS})


if __name__ == "__main__":
    main()
