"""`dsv4sel check`'s host-class check where a vLLM release is installed (one platform).

    VENV/bin/python tests/hosts/vllm/harness/hostcheck.py PLATFORM [--rules DIR]

Runs the verifier on the shipped rules (and, under ``with_pack``, on the shipped rules plus DIR as
a pack) with vLLM's platform stubbed, and prints the ``host`` findings as JSON, with the members of vLLM's AttentionBackendEnum and
CacheDType that the rules' vocabulary lacks: every vLLM class the rules name must import from the
installed vLLM. vLLM's ROCm modules import only on a ROCm platform object, its NVIDIA, CPU and
XPU modules on every one, so the ROCm platform is where all of them can be checked at once.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import oracle  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("platform")
    ap.add_argument("--rules")
    args = ap.parse_args()
    oracle.prepare(args.platform)
    import dsv4sel
    from dsv4sel.engine.sources import shipped_rules_dir

    from vllm.config.cache import CacheDType
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from typing import get_args

    def check(rules) -> dict:
        report = dsv4sel.verify(rules)
        hosts = sorted({cls for row in rules.rows if row.kind == "select" for host, cls, _ in row.hosts
                        if host == "vllm"})
        return {"enum_missing": sorted(m.name for m in AttentionBackendEnum if m.name not in rules.backends),
                "cache_dtype_missing": sorted(v for v in get_args(CacheDType) if v not in rules.values("kv_cache_dtype")),
                "classes": hosts, "host_findings": [f.message for f in report.findings if f.kind == "host"]}

    out = check(dsv4sel.default_rules())
    if args.rules:  # the shipped rules plus the pack, in the same process (vLLM imported once)
        out["with_pack"] = check(dsv4sel.load_rules(paths=[shipped_rules_dir(), args.rules]))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
