"""``dsv4sel explain``: why this backend and cache format for one query."""

from __future__ import annotations

import argparse

from .common import add_rules_option


def add_parser(sub) -> None:
    p = sub.add_parser("explain", help="show the selection for one query and the rules that decided it")
    p.add_argument("--platform", required=True)
    p.add_argument("--capability", default=None)
    p.add_argument("--backend", default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--model", default="deepseek_v4")
    add_rules_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from .. import select
    from ..errors import InvalidQuery, SelectionError
    from .common import load

    rules = load(args)
    try:
        sel = select(platform=args.platform, capability=args.capability, backend=args.backend,
                     kv_cache_dtype=args.kv_cache_dtype, model=args.model, rules=rules)
    except InvalidQuery as exc:
        print(f"dsv4sel explain: {exc}")
        return 2
    except SelectionError as exc:
        print(f"rejected: {exc}")
        return 1
    print(f"backend         {sel.backend}")
    print(f"impl            {sel.impl}")
    print(f"layout          {sel.layout}")
    print(f"cache dtype     {sel.cache_dtype} (torch {sel.torch_dtype_name})")
    print(f"bytes per token {sel.bytes_per_token}")
    print(f"block size      {sel.block_size}")
    for name, value in sel.rewrites.items():
        before = getattr(sel.query, name, "?")
        print(f"rewrite         {name}: {before} -> {value}")
    for message in sel.messages:
        print(f"{message.level:<15} {message}")
    for ref in sel.path:
        print(f"rule            {ref.id} ({ref.location})")
    return 0
