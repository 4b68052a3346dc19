"""Many rule files are bounded as a whole (issue 32, point 9): one load, all packs together,
reads at most ``MAX_LOAD_FILES`` files and ``MAX_LOAD_BYTES`` bytes and holds at most
``MAX_LOAD_NODES`` YAML nodes. Past a bound it is one DSV110 problem at the file that crosses it,
naming the bound, the measured value and the way out, from ``select()`` and ``check`` alike,
within 2 s of CPU. Before, 300 small files (8.8 MB) cost a cold ``select()`` 22 s of CPU and
``check`` 28 s (issue 32 measured 41 s and 98 s on its set).

The packs are generated at test time: hundreds of files, or megabytes, are not worth
committing. Each file is one backend table of ``rules`` rules, every rule a distinct point,
as a large real pack would be."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dsv4sel
from dsv4sel.engine.build import load_and_validate
from dsv4sel.engine.sources import (MAX_LOAD_BYTES, MAX_LOAD_FILES, MAX_LOAD_NODES, default_packs,
                                    directory_pack, shipped_pack)
from dsv4sel.dsv4.profile import PROFILE

from _bounds import CpuTimer
from _cli import environ, run
from _repo import REPO

CAPABILITIES = ("8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "12.1")
DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_ds_mla", "bfloat16")
HEAD = """\
kind: backend
backends: [GEN{f}_MLA]
hit_policy: first
defaults:
  impl: dsv4sel.kernels.reference:DeepseekV4ReferenceSparseImpl
  layout: fp8_ds_mla
  cache_dtype: fp8_ds_mla
  torch_dtype: uint8
  bytes_per_token: 584
  block_size: 256
rules:
"""
RULE = """\
  - id: gen{f}-r{r}
    description: generated rule {r} of file {f}, as long as the description of a real rule would be.
    when: {{platform: cuda, capability: "{capability}", kv_cache_dtype: {dtype}}}
    reject:
      reason: generated rule {r} refuses {{kv_cache_dtype}} on {{capability}}.
"""
REST = """\
  - id: gen{f}-rest
    reject:
      reason: no.
"""


def generated_pack(directory: Path, files: int, rules: int, padding: int = 0) -> str:
    """A pack of ``files`` backend tables of ``rules`` rules each, every file padded with
    ``padding`` bytes of comment."""
    directory.mkdir()
    for f in range(files):
        body = [HEAD.format(f=f)]
        body += [RULE.format(f=f, r=r, capability=CAPABILITIES[r % 7], dtype=DTYPES[r // 7 % 5]) for r in range(rules)]
        body.append(REST.format(f=f))
        if padding:
            body.append(("#" * 99 + "\n") * (padding // 100))
        (directory / f"g{f:03d}.yaml").write_text("".join(body))
    return str(directory)


def refusal(paths) -> tuple[dsv4sel.Problem, float]:
    """The one problem ``load_rules`` refuses ``paths`` with, and the CPU seconds it took."""
    with CpuTimer() as timer, pytest.raises(dsv4sel.RuleError) as info:
        dsv4sel.load_rules(paths, use_cache=False)
    (problem,) = info.value.problems
    return problem, timer.seconds


WAY_OUT = ("load only the packs this process needs (DSV4SEL_RULES_PATH, --rules), split the rules into rule sets "
           "loaded by separate processes, or raise dsv4sel.engine.sources.")


def test_300_small_files_are_refused_before_any_is_read(tmp_path):
    pack = generated_pack(tmp_path / "many", 300, 110)  # 8.8 MB: issue 32's set
    paths = [*default_packs(), pack]
    problem, seconds = refusal(paths)
    before = len(shipped_pack().sources())  # the shipped files come first
    crossing = f"g{MAX_LOAD_FILES - before:03d}.yaml"  # the first file past the bound
    assert (problem.code, problem.file, problem.line) == ("DSV110", os.path.join(pack, crossing), 1), str(problem)
    # DSV110's wording, pinned here once (tests/engine/wording.yaml's `elsewhere:`): the counts are data
    assert problem.message == (
        f"{300 + before:,} rule files in one load; a load reads at most {MAX_LOAD_FILES:,} files (this is file "
        f"{MAX_LOAD_FILES + 1:,}): {WAY_OUT}MAX_LOAD_FILES")
    assert seconds < 2, seconds
    # the message docs/untrusted-input.md quotes, for a pack it calls `hostile`
    assert f"\nhostile/{crossing}:1:1: {problem.message}\n" in Path(REPO, "docs", "untrusted-input.md").read_text()
    # check refuses it at the same place, exit 2 (rule files select() cannot load)
    report = dsv4sel.verify(paths)
    assert [(f.code, f.file, f.line) for f in report.findings] == [("DSV110", problem.file, 1)]


def test_megabytes_of_rule_files_are_refused_before_any_is_read(tmp_path):
    # 6 files of 800 kB of comments each: within the bound of one file, over that of a load
    pack = generated_pack(tmp_path / "big", 6, 2, padding=800_000)
    problem, seconds = refusal([*default_packs(), pack])
    assert (problem.code, problem.file) == ("DSV110", os.path.join(pack, "g005.yaml")), str(problem)
    total = sum(os.path.getsize(s.path) for p in [*default_packs(), directory_pack(pack)] for s in p.sources())
    assert problem.message == (
        f"the rule files hold {total:,} bytes in all; a load reads at most {MAX_LOAD_BYTES:,} (this file crosses "
        f"it): {WAY_OUT}MAX_LOAD_BYTES")
    assert seconds < 2, seconds


def test_too_many_yaml_nodes_in_all_are_refused_at_the_file_that_crosses_the_bound(tmp_path):
    # 60 files of 110 rules: 1.8 MB, within the files and bytes bounds, ~110,000 YAML nodes
    pack = generated_pack(tmp_path / "dense", 60, 110)
    problem, seconds = refusal([*default_packs(), pack])
    assert problem.code == "DSV110" and re.fullmatch(re.escape(pack) + r"/g0\d\d\.yaml", problem.file), str(problem)
    assert re.fullmatch(
        rf"the rule files expand to more than {MAX_LOAD_NODES:,} YAML nodes in all \([\d,]+ up to this file, "
        rf"\d+ of \d+ files\); a load holds at most {MAX_LOAD_NODES:,}: " + re.escape(WAY_OUT) + "MAX_LOAD_NODES",
        problem.message), problem.message
    # every file is parsed before any is validated (the costly step): the refusal costs the parse
    assert seconds < 2, seconds


def test_select_through_the_rules_path_and_check_refuse_it_too(tmp_path):
    pack = generated_pack(tmp_path / "many", 300, 1)
    code = ("import dsv4sel\ntry:\n    dsv4sel.select(platform='cuda', capability='9.0')\n"
            "except dsv4sel.RuleError as exc:\n    print(exc.problems[0].code, len(exc.problems))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env=environ(DSV4SEL_RULES_PATH=pack))
    assert proc.stdout.split() == ["DSV110", "1"], (proc.stdout, proc.stderr[-2000:])
    result = run("check", "--rules", pack)
    assert result.rc == 2 and "DSV110" in result.out and "MAX_LOAD_FILES" in result.out, result
    result = run("explain", "--platform", "cuda", "--rules", pack)
    assert result.rc == 2 and "(DSV110)" in result.err, result


def _measured(paths: list[str]) -> tuple[int, int, int]:
    """(files, bytes, YAML nodes) of one load of ``paths``."""
    sources = [s for p in paths for s in directory_pack(p).sources()]
    files = load_and_validate(sources, PROFILE.schema)
    return len(sources), sum(os.path.getsize(s.path) for s in sources), sum(f.nodes for f in files)


LEGIT = {
    "shipped and the b12x pack": ["rules", "examples/b12x-pack/dsv4sel_b12x/rules"],
    "vLLM 0.33 compat set": ["rules/compat/vllm-0.33"],
    "SGLang 0.5.23 compat set": ["rules/compat/sglang-0.5.23"],
}


@pytest.mark.parametrize("name", LEGIT)
def test_real_rule_sets_stay_far_inside_every_bound(name):
    files, size, nodes = _measured([os.path.join(REPO, p) for p in LEGIT[name]])
    assert files * 10 <= MAX_LOAD_FILES and size * 10 <= MAX_LOAD_BYTES and nodes * 10 <= MAX_LOAD_NODES, \
        (files, size, nodes)


def test_even_all_of_them_loaded_together_stay_inside_a_fifth_of_every_bound():
    files, size, nodes = _measured([os.path.join(REPO, p) for paths in LEGIT.values() for p in paths])
    assert files * 5 <= MAX_LOAD_FILES and size * 5 <= MAX_LOAD_BYTES and nodes * 5 <= MAX_LOAD_NODES, \
        (files, size, nodes)
