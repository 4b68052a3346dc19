# ruff: noqa: B023 - every closure is called inside the iteration that made it
"""Probe (issue 21): eager run() replaying a captured graph against the direct op call and the raw
interface, per shape, to pick flashmla_replay.MAX_REPLAY_ROWS.

    python benchmarks/kernels/probe_eager_graph.py [--json out.json]
"""
import argparse
import os

import torch
from _timing import dump, machine
from bench_flashmla_plan_run import TOPK, WINDOW
from probe_host_costs import SCALE, flashmla_setup, wall

import dsv4sel.kernels.flashmla_replay as replay_mod
from dsv4sel.kernels.flashmla import flashmla_build

SHAPES = ((4, 16), (1, 64), (4, 64), (16, 64), (32, 64), (64, 64), (128, 64), (128, 128))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    replay_mod.MAX_REPLAY_ROWS = 1 << 30  # every shape replays here: the probe compares
    lib = flashmla_build().module
    results = {}
    print(machine("cuda"))
    for batch, heads in SHAPES:
        impl, layers, tl_, etl, raw, c = flashmla_setup(lib, batch, heads)
        tag = f"b{batch}h{heads}"

        def planned():
            return impl.plan(batch=batch, heads=heads, topk=WINDOW, extra_topk=TOPK, softmax_scale=SCALE,
                             topk_length=tl_, extra_topk_length=etl)

        os.environ[replay_mod.REPLAY_ENV] = "off"
        direct = planned()
        del os.environ[replay_mod.REPLAY_ENV]
        plan = planned()
        rep = plan.state["replay"]

        def run(plan=plan):
            i = c[0] = (c[0] + 1) & 3
            return impl.run(**layers[i], plan=plan)

        def run_direct():
            return run(direct)

        for _ in range(2):
            for la in layers:
                a, b = impl.run(**la, plan=plan), impl.run(**la, plan=direct)
                assert torch.equal(a.out, b.out) and torch.equal(a.lse, b.lse), tag
        rows = []
        for rnd in range(5):
            vals = {n: wall(f, calls=240) for n, f in (("raw", raw), ("run replay", run), ("run direct", run_direct))}
            rows.append(vals)
            print(tag, rnd, " ".join(f"{n}={v:.2f}" for n, v in vals.items()),
                  f"| replay/raw {vals['run replay'] / vals['raw']:.3f} direct/raw {vals['run direct'] / vals['raw']:.3f}",
                  flush=True)
        med = {k: sorted(r[k] for r in rows)[2] for k in rows[0]}
        results[tag] = {**med, "replays": rep.replays if rep else 0, "usable": bool(rep and rep.usable)}
        print(tag, "median", {k: round(v, 2) if isinstance(v, float) else v for k, v in results[tag].items()}, flush=True)
    if args.json:
        dump(args.json, results)


if __name__ == "__main__":
    main()
