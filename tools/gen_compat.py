#!/usr/bin/env python3
"""Write (or check) one engine release's compat rule set under rules/compat/.

    python3 tools/gen_compat.py --host vllm --version 0.34.0          # rewrite rules/compat/vllm-0.34/
    python3 tools/gen_compat.py --host vllm --version 0.34.0 --check  # exit 1 when it is stale
    python3 tools/gen_compat.py --all [--check]                       # every release

A compat set states, as rules, what that release itself decides for DeepSeek-V4. The releases
are the host registry's (dsv4sel/dsv4/host_registry.py); what each one decides lives in its own
module, tools/compat/<host>_<release>.py (tools/compat/__init__.py states their contract); this
driver is the same for all: it writes the files the
module builds, removes generated files the module no longer builds, and with ``--check`` changes
nothing and names every stale file. Exit codes: 0 written or fresh, 1 stale, 2 an unknown release.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "compat"))
sys.path.insert(0, HERE)

from compat import RELEASES  # noqa: E402


def _module(host: str, version: str):
    return importlib.import_module(RELEASES[(host, version)][0])


def command(host: str, version: str, check: bool = False) -> str:
    return f"python3 tools/gen_compat.py --host {host} --version {version}" + (" --check" if check else "")


def stale_files(out: str, files: dict[str, str], hand_written: frozenset[str]) -> list[str]:
    """The files of folder ``out`` that differ from ``files``, are missing, or are generated
    ``.yaml`` files ``files`` no longer has."""
    present = {n for n in os.listdir(out) if n.endswith(".yaml")} if os.path.isdir(out) else set()
    differ = []
    for name, text in files.items():
        path = os.path.join(out, name)
        if not os.path.exists(path):
            differ.append(name)
            continue
        with open(path) as fh:
            if fh.read() != text:
                differ.append(name)
    return sorted(differ) + sorted(present - set(files) - hand_written)


def generate(host: str, version: str, check: bool) -> int:
    module = _module(host, version)
    folder = RELEASES[(host, version)][1]
    out = os.path.join(ROOT, "rules", *folder.split("/"))
    files = module.build()
    stale = stale_files(out, files, module.HAND_WRITTEN)
    if check:
        if stale:
            print(f"rules/{folder}: stale: {', '.join(stale)} (run {command(host, version)})", file=sys.stderr)
            return 1
        return 0
    os.makedirs(out, exist_ok=True)
    present = {n for n in os.listdir(out) if n.endswith(".yaml")}
    for name in present - set(files) - module.HAND_WRITTEN:
        os.remove(os.path.join(out, name))
    for name, text in files.items():
        with open(os.path.join(out, name), "w") as fh:
            fh.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--host", choices=sorted({h for h, _ in RELEASES}))
    ap.add_argument("--version", help="the release, as its engine names it (0.34.0)")
    ap.add_argument("--all", action="store_true", help="every release tools/compat/ knows")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a file is stale")
    args = ap.parse_args(argv)
    if args.all:
        wanted = sorted(RELEASES)
    elif args.host and args.version:
        wanted = [(args.host, args.version)]
    else:
        ap.error("give --host and --version, or --all")
    for host, version in wanted:
        if (host, version) not in RELEASES:
            known = ", ".join(v for h, v in sorted(RELEASES) if h == host) or "none"
            print(f"error: {host} {version} is not a release dsv4sel supports (known {host} releases: {known}; "
                  "a new one is a line in dsv4sel/dsv4/host_registry.py and a module under tools/compat/)", file=sys.stderr)
            return 2
    return max(generate(host, version, args.check) for host, version in wanted)


if __name__ == "__main__":
    raise SystemExit(main())
