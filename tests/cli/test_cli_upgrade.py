"""``dsv4sel upgrade HOST FROM TO`` as a user runs it: the report on one screen, the JSON
with every change, the exit codes, and the real vLLM 0.33 -> 0.34 pair when its compat sets
are both here.

The hand-made pair (tests/tools/rules/upgrade/compat/) changes one thing of every category;
tests/tools/test_upgrade.py checks the model, this file what the command prints."""

from __future__ import annotations

import json
import shutil

import pytest

import dsv4sel
from dsv4sel.cli.render import upgrade as render
from dsv4sel.cli.render.data import document
from dsv4sel.tools.releases import compat_dir, find_release
from dsv4sel.tools.upgrade import upgrade

from _cli import REPO, run

PAIR = REPO / "tests" / "tools" / "rules" / "upgrade"
REAL_034 = REPO / "rules" / "compat" / "vllm-0.34"


def test_the_report_is_what_the_value_renders_and_exit_1_says_something_changed():
    r = run("upgrade", "vllm", "0.33", "0.34", "--rules-dir", str(PAIR))
    assert r.rc == 1 and r.err == "", r
    host, old = find_release("vllm", "0.33")
    _, new = find_release("vllm", "0.34")
    paths = (compat_dir(host, old, str(PAIR)), compat_dir(host, new, str(PAIR)))
    result = upgrade(host, old, new, dsv4sel.load_rules([paths[0]]), dsv4sel.load_rules([paths[1]]), paths)
    assert r.out == render.text(result)
    data = run("upgrade", "vllm", "0.33", "0.34", "--rules-dir", str(PAIR), "--json")
    assert (data.rc, data.out) == (1, document(render.as_dict(result)))


def test_each_category_is_a_count_and_its_groups_old_to_new():
    out = run("upgrade", "vllm", "0.33", "0.34", "--rules-dir", str(PAIR)).out
    lines = out.splitlines()
    assert lines[0] == ("vLLM 0.33.0 -> 0.34.0: 48 of 168 inputs decide differently, "
                        "42 more only reword a refusal or a log line")
    assert lines[lines.index("lora decides now (vLLM 0.33 ignores it): 2 inputs") + 1:][:2] == [
        "       1  A vllm=AttentionA -> D vllm=AttentionD",
        "          platform=cuda capability=10.0 backend=<none> kv_cache_dtype=auto lora=on"]
    for line in ("       4  B block=128 -> B block=64",
                 "       4  unknown to 0.33 -> A vllm=AttentionA90V2",
                 "       2  B vllm=AttentionB -> refused by B",
                 "       8  C vllm=AttentionC -> D vllm=AttentionD",
                 "       8  A vllm=AttentionA90 -> A vllm=AttentionA90V2",
                 "       4  C layout=fp8_ds_mla cache_dtype=fp8_ds_mla torch=uint8 bytes/token=584 -> "
                 "C layout=fp8_e4m3_row cache_dtype=fp8 torch=float8_e4m3fn bytes/token=512"):
        assert line in lines, line
    # what only rewords a refusal or a log line is counted, not listed
    assert "36 inputs: refused (or unknown) in both releases, for another reason; not listed" in lines
    assert "6 inputs: only log lines or dsv4sel's own impl differ; not listed" in lines
    assert "B serves SM120 only" not in out and "A on SM100" not in out
    assert lines[-1] == "no change in: backends a name builds"


def test_the_json_lists_every_changed_input_with_its_exact_outcomes():
    data = json.loads(run("upgrade", "vllm", "0.33", "0.34", "--rules-dir", str(PAIR), "--json").out)
    assert (data["version"], data["host"], data["old"], data["new"]) == (1, "vllm", "0.33.0", "0.34.0")
    assert data["changed"] == 90 == sum(c["inputs"] for c in data["categories"])
    assert data["decided"] == 90 - 36 - 6
    reworded = next(c for c in data["categories"] if c["category"] == "reworded")
    changes = [change for group in reworded["groups"] for change in group["changes"]]
    assert sum(c["inputs"] for c in changes) == 36  # listed in full here, though the text only counts them
    assert {"kind": "reject", "backend": "R", "reason": "R runs on ROCm only"} in [c["new"] for c in changes]
    (block,) = next(c for c in data["categories"] if c["category"] == "block")["groups"]
    (change,) = block["changes"]
    assert (change["old"]["block_size"], change["new"]["block_size"], change["new"]["class"]) == (
        128, 64, "vllm.b:AttentionB")


def test_a_release_against_itself_exits_0():
    r = run("upgrade", "vllm", "0.34", "0.34.0", "--rules-dir", str(PAIR))
    assert (r.rc, r.out) == (0, "vLLM 0.34.0 -> 0.34.0: no change: 168 inputs decide the same way\n")


@pytest.mark.parametrize("args, message", [
    (("vlm", "0.33", "0.34"), "unknown host 'vlm'; did you mean 'vllm'?; known hosts: sglang, vllm"),
    (("vllm", "0.33", "0.35"), "vLLM has no release '0.35' that dsv4sel follows; known releases: "
                               "0.33 (0.33.0), 0.34 (0.34.0)"),
    (("sglang", "0.5.23", "0.33"), "SGLang has no release '0.33' that dsv4sel follows; known releases: 0.5.23"),
])
def test_an_unknown_host_or_release_is_one_error_naming_the_known_ones(args, message):
    r = run("upgrade", *args)
    assert (r.rc, r.out) == (2, "")
    assert r.err == f"dsv4sel upgrade: error: {message}\n"
    doc = json.loads(run("upgrade", *args, "--json").out)
    assert doc["ok"] is False and doc["error"]["kind"] == "input" and doc["error"]["message"] == message


def test_a_compat_set_that_is_not_there_is_unusable_input(tmp_path):
    r = run("upgrade", "vllm", "0.33", "0.34", "--rules-dir", str(tmp_path))
    assert r.rc == 2 and "Traceback" not in r.err
    assert r.err.startswith("dsv4sel upgrade: error: vLLM 0.33.0's compat rule set is not here: no directory "
                            f"{tmp_path / 'compat' / 'vllm-0.33'} (the registry names compat/vllm-0.33 under "
                            "the rules directory)")


def test_a_compat_set_that_does_not_load_is_unusable_input_with_its_location(tmp_path):
    root = tmp_path / "rules"
    shutil.copytree(PAIR, root)
    broken = root / "compat" / "vllm-0.34" / "b.yaml"
    broken.write_text(broken.read_text().replace("kv_cache_dtype: fp8}", "kv_cache_dtype: fp9}"))
    r = run("upgrade", "vllm", "0.33", "0.34", "--rules-dir", str(root))
    assert r.rc == 2 and "Traceback" not in r.err
    assert f"{broken}:" in r.err and "DSV301" in r.err and "fp9" in r.err


def test_completion_offers_the_registry_s_hosts_and_releases():
    pytest.importorskip("shtab")
    script = run("completion", "bash").out
    assert "_shtab_dsv4sel_upgrade_pos_0_choices=(sglang vllm)" in script
    assert " 0.34 0.34.0 " in script.split("_shtab_dsv4sel_upgrade_pos_1_choices=(")[1].split(")")[0] + " "


@pytest.mark.skipif(not REAL_034.is_dir(), reason="rules/compat/vllm-0.34 is not on this branch yet")
def test_the_real_upgrade_from_vllm_033_to_034_reads_in_one_screen():
    r = run("upgrade", "vllm", "0.33", "0.34")
    assert r.rc == 1 and r.err == "", r
    lines = r.out.splitlines()
    assert lines[1].startswith("(rules/compat/vllm-0.33 -> rules/compat/vllm-0.34;")
    assert len(lines) <= 45
    # what vLLM 0.34 changed for DeepSeek-V4 (../shared/vllm-0.34.md), each under its heading
    assert "lora decides now (vLLM 0.33 ignores it): " in r.out
    accepted = r.out.split("names newly accepted")[1].split("\n\n")[0]
    assert "FLASHINFER_TS" in accepted and "KIMI_K3_KV_BALANCED_MLA" in accepted
    block = r.out.split("another block size: ")[1].split("\n\n")[0]
    assert "FLASHINFER_MLA_SPARSE_DSV41 block=128 -> FLASHINFER_MLA_SPARSE_DSV41 block=64" in block
    assert "capability=12.x" in block


def test_the_docs_page_states_the_real_upgrade():
    page = REPO / "docs" / "upgrade-vllm-0.33-to-0.34.md"
    if not REAL_034.is_dir():
        pytest.skip("rules/compat/vllm-0.34 is not on this branch yet")
    text = page.read_text()
    assert "$ dsv4sel upgrade vllm 0.33 0.34\n" in text
    for doc in ("docs/vllm.md", "README.md"):
        assert "upgrade-vllm-0.33-to-0.34.md" in (REPO / doc).read_text(), doc
