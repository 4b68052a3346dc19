"""dsv4sel diff: the review tool for a pull request that edits rules."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from _repo import REPO
from _rule_text import edited_shipped_rules

DSV4SEL = [os.path.join(os.path.dirname(sys.executable), "dsv4sel")]


def run(*args, cwd=None, env=None):
    return subprocess.run([*DSV4SEL, *args], capture_output=True, text=True, cwd=cwd or REPO, env=env)


@pytest.fixture
def edited_rules(tmp_path):
    """A copy of the shipped rules in which SM12x defaults to FlashMLA."""
    return edited_shipped_rules(tmp_path / "rules")


def test_identical_rule_sets_exit_zero():
    rules = os.path.join(REPO, "rules")
    result = run("diff", rules, rules)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("no change: ")


def test_changes_are_grouped_into_cubes_with_both_outcomes(edited_rules):
    result = run("diff", os.path.join(REPO, "rules"), edited_rules)
    assert result.returncode == 1, result.stderr
    out = result.stdout
    assert "184 of " in out.splitlines()[0]
    assert ("model=deepseek_v4 platform=cuda capability=12.x backend=<none> "
            "kv_cache_dtype=auto,fp8,fp8_e4m3 prefill_context_parallel=off lora=off flashinfer_sm120=available\n") in out
    assert "mega_attn" not in out  # every value: left out of the cube
    assert "old: select FLASHINFER_MLA_SPARSE_DSV4 layout=fp8_ds_mla" in out
    assert "new: reject (FLASHMLA_SPARSE_DSV4): FlashMLA's sparse kernels are built for SM90 and SM100 only" in out


def test_json_output_counts_every_changed_input(edited_rules):
    result = run("diff", "--json", os.path.join(REPO, "rules"), edited_rules)
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert data["changed"] == sum(c["inputs"] for c in data["changes"]) == 184
    assert data["compared"] > 40000


def test_moving_a_rule_is_not_a_change(tmp_path):
    copy = tmp_path / "rules"
    shutil.copytree(os.path.join(REPO, "rules"), copy)
    path = copy / "flashmla.yaml"
    path.write_text(path.read_text().replace("rules:\n", "rules:\n\n\n  # moved down three lines\n", 1))
    result = run("diff", os.path.join(REPO, "rules"), str(copy))
    assert result.returncode == 0, result.stdout


def test_a_bad_side_is_unusable_input_with_its_location(tmp_path):
    result = run("diff", os.path.join(REPO, "rules"), str(tmp_path / "missing"))
    assert result.returncode == 2
    assert "cannot read rule file" in result.stderr and "Traceback" not in result.stderr


def test_a_pack_diff_compares_the_default_rules_with_and_without_it():
    pack = os.path.join(REPO, "examples", "b12x-pack", "dsv4sel_b12x", "rules")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "examples", "b12x-pack"),
                                                    os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([*DSV4SEL, "diff", "--pack", "--allow-impl-module", "dsv4sel_b12x", "-", pack],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 1, result.stderr
    assert "platform=cuda capability=12.1 backend=<none>" in result.stdout
    assert "new: select B12X_MLA_SPARSE" in result.stdout


def test_a_rule_file_that_is_not_utf8_is_a_located_problem(tmp_path):
    bad = tmp_path / "rules"
    bad.mkdir()
    (bad / "x.yaml").write_bytes(b"\xff\xfe\x00 not utf-8")
    result = run("diff", str(bad), str(bad))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "x.yaml:1:1: the file is not UTF-8 text" in result.stderr


def test_a_bug_in_a_command_is_one_line_and_exit_3(monkeypatch, capsys):
    from dsv4sel import cli

    def broken(args):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(cli.diff, "run", broken)
    monkeypatch.delenv("DSV4SEL_DEBUG", raising=False)
    assert cli.main(["diff", "a", "b"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error" in err and "DSV4SEL_DEBUG=1" in err
    monkeypatch.setenv("DSV4SEL_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        cli.main(["diff", "a", "b"])


def test_the_array_comparison_gives_what_a_lookup_per_key_gives(edited_rules):
    """diff's fast path (same points, compared array slice by array slice) against the
    lookup of every key, on an edit of the shipped rules and on the example pack."""
    import dsv4sel
    from dsv4sel.engine.sources import default_packs
    from dsv4sel.tools import diff as tool

    shipped = dsv4sel.load_rules([os.path.join(REPO, "rules")])
    edited = dsv4sel.load_rules([edited_rules])
    pack = dsv4sel.load_rules([*default_packs(), os.path.join(REPO, "examples", "b12x-pack", "dsv4sel_b12x", "rules")],
                              allowed_impl_modules=("dsv4sel.kernels", "dsv4sel_b12x"))
    for old, new in ((shipped, edited), (pack, shipped)):
        fast, slow = tool.diff(old, new), tool._diff_keys(old, new)
        assert fast.compared == slow.compared and fast.changed == slow.changed
        assert fast.changes == slow.changes


def test_the_pack_review_keeps_its_lines_bounded():
    # its speed against check's is measured by benchmarks/bench_diff.py, not here
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "examples", "b12x-pack"))
    result = run("diff", "--pack", "--allow-impl-module", "dsv4sel_b12x", "-",
                 "examples/b12x-pack/dsv4sel_b12x/rules", env=env)
    assert result.returncode == 1
    longest = max(len(line) for line in result.stdout.splitlines())
    assert longest < 250, longest  # was 411: every kv dtype listed, every `=*`, impl on the same line
