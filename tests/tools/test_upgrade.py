"""dsv4sel upgrade's model (dsv4sel.tools.upgrade), in process: every changed input of two
releases' compat sets in the category a user reads it under.

The hand-made pair under rules/upgrade/compat/ (vllm-0.33, vllm-0.34) changes one thing of
every category on purpose; each rule that makes a change says which in its description. The
same pair with test-time edits shows what decides whether an input is new, and a copy of the
shipped 0.33 compat set whose only change is FlashInfer-V4.1's SM12x block size shows that
nothing else of a real-size space is reported.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

import dsv4sel
from dsv4sel.dsv4.host_registry import HOSTS
from dsv4sel.tools.releases import UnknownRelease, compat_dir, find_release
from dsv4sel.tools.upgrade import CATEGORIES, upgrade

from _repo import REPO

PAIR = Path(__file__).parent / "rules" / "upgrade"


def compare(root, old="0.33", new="0.34", old_root=None):
    """Release ``old`` (its compat set under ``old_root``, else ``root``) against ``new``."""
    host, old_release = find_release("vllm", old)
    _, new_release = find_release("vllm", new)
    paths = compat_dir(host, old_release, str(old_root or root)), compat_dir(host, new_release, str(root))
    return upgrade(host, old_release, new_release, dsv4sel.load_rules([paths[0]]), dsv4sel.load_rules([paths[1]]),
                   paths)


def counts(result) -> dict:
    return {(c.name, c.input): c.count for c in result.categories}


@pytest.fixture(scope="module")
def result():
    return compare(PAIR)


def test_every_changed_input_is_in_exactly_one_category(result):
    assert counts(result) == {
        ("input", "lora"): 2, ("accepted", None): 12, ("refused", None): 4, ("default", None): 8,
        ("to_refusal", None): 2, ("to_decision", None): 4, ("class", None): 8, ("format", None): 4,
        ("block", None): 4, ("other", None): 6, ("reworded", None): 36}
    assert (result.changed, result.decided) == (90, 90 - 36 - 6)
    # 7 requested backends (N is new) x 24 points (the new lora input doubles the old 12)
    assert result.compared == 7 * 24
    assert [c.name for c in result.categories] == [n for n in CATEGORIES if n != "backend"]
    for category in result.categories:
        assert category.count == sum(g.count for g in category.groups)
        for group in category.groups:
            assert group.count == sum(d.count for d in group.details)


def group(result, name):
    (category,) = [c for c in result.categories if c.name == name]
    return category.groups


def test_an_input_the_old_release_lacks_decides_where_the_new_one_reads_it(result):
    # SM100 with LoRA on defaults to D: auto builds it, fp8 is refused by it; LoRA off keeps A
    (to_refusal, to_d) = sorted(group(result, "input"), key=lambda g: g.new.kind)
    assert (to_d.old.backend, to_d.new.backend, to_d.new.kind) == ("A", "D", "select")
    assert to_d.cubes == ("platform=cuda capability=10.0 backend=<none> kv_cache_dtype=auto lora=on",)
    assert (to_refusal.new.kind, to_refusal.new.backend) == ("refused", "D")


def test_a_name_the_old_release_does_not_know_is_accepted_where_the_new_one_builds(result):
    by_backend = {g.cubes: (g.old.kind, g.new.backend, dict(g.new.fields)) for g in group(result, "accepted")}
    assert by_backend == {
        ("platform=rocm capability=unknown,gfx942 backend=R",): ("refused", "C", {"host_class": "vllm.c:AttentionC"}),
        ("platform=cuda capability=9.0 backend=N",): ("absent", "A", {"host_class": "vllm.a:AttentionA90V2"})}


def test_selections_that_differ_show_only_what_differs(result):
    (block,) = group(result, "block")
    assert (block.old.fields, block.new.fields) == ((("block_size", 128),), (("block_size", 64),))
    assert block.cubes == ("platform=cuda capability=12.0 backend=<none>,B kv_cache_dtype=auto",)
    (cls,) = group(result, "class")
    assert (cls.old.fields, cls.new.fields) == ((("host_class", "vllm.a:AttentionA90"),),
                                                (("host_class", "vllm.a:AttentionA90V2"),))
    (fmt,) = group(result, "format")
    assert dict(fmt.new.fields) == {"layout": "fp8_e4m3_row", "cache_dtype": "fp8", "torch_dtype": "float8_e4m3fn",
                                    "bytes_per_token": 512}
    (other,) = group(result, "other")
    assert other.new.fields == (("messages", (("info", "A on SM100"),)),)


def test_the_class_and_block_size_are_those_of_each_release(result):
    # every selection names its class for its own release only (>=0.33 / >=0.34): a class or
    # block size read for the wrong release would make every selection a change
    (detail,) = group(result, "block")[0].details
    assert (detail.old.host_class, detail.old.block_size, detail.old.outcome.block_size) == ("vllm.b:AttentionB", 128, 128)
    assert (detail.new.host_class, detail.new.block_size, detail.new.outcome.block_size) == ("vllm.b:AttentionB", 64, 128)


def _copy_with(tmp_path, edit) -> Path:
    root = tmp_path / "rules"
    shutil.copytree(PAIR, root)
    edit(root / "compat")
    return root


def test_an_input_the_old_release_declares_but_never_decides_on_is_new_as_well(tmp_path):
    def declare_lora(compat):
        path = compat / "vllm-0.33" / "vocabulary.yaml"
        path.write_text(path.read_text() + '  lora: {default: "off", values: ["off", "on"]}\n')

    edited = compare(_copy_with(tmp_path, declare_lora))
    assert counts(edited)[("input", "lora")] == 2
    assert edited.compared == 7 * 24


def test_an_input_the_old_release_decides_on_is_not_new(tmp_path):
    def decide_on_lora(compat):
        vocabulary = compat / "vllm-0.33" / "vocabulary.yaml"
        vocabulary.write_text(vocabulary.read_text() + '  lora: {default: "off", values: ["off", "on"]}\n')
        defaults = compat / "vllm-0.33" / "defaults.yaml"
        defaults.write_text(defaults.read_text().replace(
            "rules:\n", 'rules:\n  - id: default-9-lora\n    when: {capability: "9.0", lora: "on"}\n'
                        '    reject: {reason: "no LoRA on SM90"}\n', 1))

    found = counts(compare(_copy_with(tmp_path, decide_on_lora)))
    assert ("input", "lora") not in found
    # SM100 with LoRA: A -> D is another default, A -> refused a refusal; SM90 with LoRA is decided now
    assert found[("default", None)] == 8 + 1 and found[("to_refusal", None)] == 2 + 1
    assert found[("to_decision", None)] == 4 + 2


def test_a_release_compared_with_itself_changes_nothing():
    same = compare(PAIR, "0.34", "0.34.0")
    assert (same.categories, same.changed, same.compared) == ((), 0, 7 * 24)


def test_unknown_hosts_and_releases_name_the_known_ones(tmp_path):
    with pytest.raises(UnknownRelease, match=r"unknown host 'vlm'; did you mean 'vllm'\?; known hosts: sglang, vllm"):
        find_release("vlm", "0.33")
    with pytest.raises(UnknownRelease, match=r"vLLM has no release '0.35' .*known releases: 0.33 \(0.33.0\), 0.34 \(0.34.0\)"):
        find_release("vllm", "0.35")
    host, release = find_release("sglang", "0.5.23")
    with pytest.raises(UnknownRelease, match="SGLang 0.5.23's compat rule set is not here: no directory "):
        compat_dir(host, release, str(tmp_path))


def test_the_registry_names_a_compat_set_that_ships_for_the_oldest_release_of_each_host():
    for host in HOSTS.values():
        assert os.path.isdir(compat_dir(host, host.releases[0]))


@pytest.fixture(scope="module")
def sm12x_block_only(tmp_path_factory):
    """A rules directory holding a copy of the shipped 0.33 compat set that speaks for 0.34
    (each class entry for 0.33 moved to 0.34) and whose only change is FlashInfer-V4.1's SM12x
    block size, 64."""
    root = tmp_path_factory.mktemp("standin")
    new = root / "compat" / "vllm-0.34"
    shutil.copytree(os.path.join(REPO, "rules", "compat", "vllm-0.33"), new)
    for path in new.glob("*.yaml"):
        path.write_text(path.read_text().replace("'>=0.33.0,<0.34'", "'>=0.34.0,<0.35'"))
    path = new / "flashinfer_dsv41.yaml"
    data = yaml.safe_load(path.read_text())
    sm12x = [r for r in data["rules"] if r.get("select") and (r.get("when") or {}).get("capability") == "12.x"]
    assert sm12x, "the compat set has no FlashInfer-V4.1 SM12x selection to edit"
    for rule in sm12x:
        rule["select"]["block_size"] = 64
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return root


def test_a_release_that_changes_one_block_size_reports_that_alone(sm12x_block_only):
    result = compare(sm12x_block_only, old_root=os.path.join(REPO, "rules"))
    assert [c.name for c in result.categories] == ["block"]
    (block,) = result.categories[0].groups
    assert (block.old.backend, block.old.fields, block.new.fields) == (
        "FLASHINFER_MLA_SPARSE_DSV41", (("block_size", 128),), (("block_size", 64),))
    assert all("capability=12.x" in cube and "model=deepseek_v4_1" in cube for cube in block.cubes)
