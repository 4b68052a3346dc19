"""`dsv4sel explain` as a user runs it: a subprocess, real exit codes, real output."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from _cli import ANSI, REPO, SHARED_CACHE, environ, rule_line, run, run_tty


def loc(file: str, rule_id: str) -> str:
    return f"rules/{file}:{rule_line(file, rule_id)}"


def test_selection_shows_outcome_rewrite_path_and_deciding_rule():
    r = run("explain", "--platform", "cuda", "--capability", "9.0", "--kv-cache-dtype", "auto")
    assert r.rc == 0, r
    assert r.err == ""
    out = r.out
    assert re.search(r"^selected\s+FLASHMLA_SPARSE_DSV4 \(platform default\)$", out, re.M), out
    assert re.search(r"^  impl\s+dsv4sel\.kernels\.flashmla:DeepseekV4FlashMLASparseImpl$", out, re.M)
    assert re.search(r"^  bytes per token\s+584 per layer \(main pool\)$", out, re.M)
    assert re.search(rf"^  decided by\s+flashmla-fp8  {re.escape(loc('flashmla.yaml', 'flashmla-fp8'))}$", out, re.M)
    assert re.search(r"^  cache_dtype  auto -> fp8_ds_mla$", out, re.M), out
    # the path: the default rule first, then the backend rule, each with file:line
    path = out[out.index("\npath\n"):]
    assert re.search(rf"1\s+default-cuda-sm9x-sm10x\s+{re.escape(loc('defaults.yaml', 'default-cuda-sm9x-sm10x'))}"
                     r"\s+default backend -> FLASHMLA_SPARSE_DSV4", path), path
    assert re.search(rf"2\s+flashmla-fp8\s+{re.escape(loc('flashmla.yaml', 'flashmla-fp8'))}\s+selects", path)


def test_why_not_lines_name_the_reason_and_rule():
    r = run("explain", "--platform", "cuda", "--capability", "9.0")
    why = r.out[r.out.index("\nwhy not\n"):]
    assert re.search(rf"FLASHINFER_MLA_SPARSE_DSV4\s+rejects \(capability\)\s+flashinfer-sm9x\s+"
                     rf"{re.escape(loc('flashinfer.yaml', 'flashinfer-sm9x'))}", why), why
    assert "TRTLLM-gen has no SM90 path" in why
    r10 = run("explain", "--platform", "cuda", "--capability", "10.0", "--kv-cache-dtype", "fp8_ds_mla")
    assert re.search(r"FLASHINFER_MLA_SPARSE_DSV4\s+rejects \(kv-cache-dtype\)", r10.out), r10.out
    assert re.search(r"accepts here: --kv-cache-dtype .*bfloat16", r10.out)


def test_rejection_exits_1_with_reason_and_nearest_alternatives():
    r = run("explain", "--platform", "cuda", "--capability", "10.0", "--kv-cache-dtype", "bfloat16")
    assert r.rc == 1, r
    assert re.search(r"^rejected\s+FLASHMLA_SPARSE_DSV4 \(platform default\)$", r.out, re.M), r.out
    assert re.search(r"^  reason\s+FLASHMLA_SPARSE_DSV4 stores the KV cache only as fp8_ds_mla", r.out, re.M)
    assert re.search(r"^  blocked by\s+kv-cache-dtype$", r.out, re.M)
    assert loc("flashmla.yaml", "flashmla-unsupported-dtype") in r.out
    # one alternative per row: the flags, then (on a line of its own when the row is too wide
    # for 100 columns) what they select
    alts = re.split(r"\n  (?=--)", r.out[r.out.index("nearest working alternatives"):])[1:]
    assert alts[0].split()[:2] == ["--kv-cache-dtype", "auto"] and "FLASHMLA_SPARSE_DSV4" in alts[0]
    assert any(alt.split()[:2] == ["--attention-backend", "FLASHINFER_MLA_SPARSE_DSV4"] and "bf16_row" in alt
               for alt in alts), alts


def test_rejection_with_nothing_nearby_says_so():
    r = run("explain", "--platform", "cuda", "--capability", "8.0")
    assert r.rc == 1
    assert "rejected  no DeepSeek-V4 backend for cuda 8.0" in r.out
    assert "  none: no backend and kv-cache dtype select on cuda 8.0" in r.out


def test_json_is_one_object_with_the_documented_keys():
    r = run("explain", "--platform", "cuda", "--capability", "9.0", "--json")
    assert r.rc == 0
    data = json.loads(r.out)
    assert list(data) == ["version", "status", "query", "selection", "rejection", "rule", "path", "rewrites",
                          "messages", "why_not", "alternatives", "rules_digest", "contract", "memory"]
    assert data["status"] == "selected" and data["selection"]["backend"] == "FLASHMLA_SPARSE_DSV4"
    assert data["rule"]["location"] == loc("flashmla.yaml", "flashmla-fp8")
    assert [p["action"] for p in data["path"]] == ["default", "select"]
    assert data["rewrites"] == [{"attribute": "cache_dtype", "before": "auto", "after": "fp8_ds_mla"}]
    bad = run("explain", "--platform", "cuda", "--capability", "10.0", "--kv-cache-dtype", "bfloat16", "--json")
    assert bad.rc == 1
    data = json.loads(bad.out)
    assert data["status"] == "rejected" and data["rejection"]["blocked_by"] == "kv_cache_dtype"
    assert data["alternatives"][0]["flags"] == "--kv-cache-dtype auto"


@pytest.mark.parametrize("args, nearest", [
    (["--platform", "cuda", "--kv-cache-dtype", "fp8_e4m4"], "did you mean 'fp8_e4m3'"),
    (["--platform", "cuda", "--backend", "flashmla_sparse_dsv"], "did you mean 'FLASHMLA_SPARSE_DSV4'"),
    (["--platform", "cdua"], "did you mean 'cuda'"),
])
def test_misspelt_values_exit_2_and_suggest_the_nearest(args, nearest):
    r = run("explain", *args)
    assert r.rc == 2, r
    assert r.out == ""
    assert r.err.startswith("dsv4sel explain: error: ") and nearest in r.err
    assert "Valid" in r.err or "backends:" in r.err  # the valid values are named too


def test_missing_platform_names_the_valid_platforms():
    r = run("explain")
    assert r.rc == 2
    assert "--platform is required (one of cuda, rocm, xpu, cpu)" in r.err


def test_pack_inputs_are_set_with_input_and_can_be_what_blocks():
    base = ("explain", "--platform", "cuda", "--capability", "10.0", "--model", "deepseek_v4_1")
    without = run(*base)
    assert without.rc == 0 and re.search(r"^selected\s+FLASHMLA_SPARSE_DSV41 ", without.out, re.M), without.out
    assert re.search(r"FLASHMLA_MEGA_ATTN_DSV41\s+rejects \(mega_attn\)\s+mega-dsv41-unavailable", without.out)
    mega = run(*base, "--input", "mega_attn=available")
    assert mega.rc == 0 and re.search(r"^selected\s+FLASHMLA_MEGA_ATTN_DSV41 ", mega.out, re.M), mega.out
    assert "mega_attn=available" in mega.out[:mega.out.index("\n\n")]  # the query line, wrapped at 100
    typo = run(*base, "--input", "mega_atn=available")
    assert typo.rc == 2 and "unknown input 'mega_atn'" in typo.err and "mega_attn" in typo.err
    assert run(*base, "--input", "mega_attn").rc == 2  # not NAME=VALUE


def test_bad_rules_dir_exits_2_with_file_line_column(tmp_path):
    rules = tmp_path / "rules"
    shutil.copytree(REPO / "rules", rules)
    text = (rules / "flashmla.yaml").read_text()
    bad = text.replace("kv_cache_dtype: [auto, fp8, fp8_e4m3]", "kv_cache_dtype: [autoo, fp8, fp8_e4m3]", 1)
    assert bad != text
    (rules / "flashmla.yaml").write_text(bad)
    line = next(i for i, t in enumerate(bad.splitlines(), 1) if "autoo" in t)
    r = run("explain", "--platform", "cuda", "--only-rules", "--rules", str(rules))
    assert r.rc == 2, r
    assert re.search(rf"flashmla\.yaml:{line}:\d+: 'autoo' is not a declared value of 'kv_cache_dtype'; "
                     r"did you mean 'auto'\?", r.err), r.err
    missing = run("explain", "--platform", "cuda", "--only-rules", "--rules", str(tmp_path / "nowhere"))
    assert missing.rc == 2 and "nowhere" in missing.err


def test_colour_only_on_a_terminal_and_never_with_no_color():
    tty = run_tty("explain", "--platform", "cuda", "--capability", "9.0", env=environ(COLUMNS="100"))
    assert tty.rc == 0 and ANSI.search(tty.out), tty.out[:300]
    # colour never moves a column or a line break: the same width gives the same text
    plain = run_tty("explain", "--platform", "cuda", "--capability", "9.0",
                    env=environ(COLUMNS="100", NO_COLOR="1")).out
    assert ANSI.sub("", tty.out) == plain
    assert max(len(line) for line in plain.splitlines()) <= 100
    # piped, it is wrapped at 100 columns whatever COLUMNS says: as on a 100-column terminal
    piped = run("explain", "--platform", "cuda", "--capability", "9.0", env=environ(COLUMNS="40")).out
    assert piped == plain
    no_color = run_tty("explain", "--platform", "cuda", "--capability", "9.0", env=environ(NO_COLOR="1"))
    assert no_color.rc == 0 and not ANSI.search(no_color.out) and "selected" in no_color.out
    piped = run("explain", "--platform", "cuda", "--capability", "10.0", "--kv-cache-dtype", "bfloat16")
    assert not ANSI.search(piped.out)


def test_output_is_stable_between_runs():
    args = ("explain", "--platform", "rocm", "--capability", "gfx942", "--backend", "FLASHMLA_SPARSE_DSV4")
    first = run(*args)
    assert first.rc == 0 and "hands over to ROCM_FLASHMLA_SPARSE_DSV4" in first.out
    assert run(*args).out == first.out


def test_detect_fills_the_platform_from_this_machine():
    r = run("explain", "--detect", env=environ(DSV4SEL_PLATFORM="cpu", CUDA_VISIBLE_DEVICES=""))
    assert r.rc == 0, r
    assert "query     cpu capability unknown (detected)" in r.out
    assert re.search(r"^selected\s+CPU_V4_MLA_SPARSE", r.out, re.M)
    assert "UserWarning" not in r.err


def test_detect_without_a_platform_says_what_to_do():
    r = run("explain", "--detect", env=environ(CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES=""))
    if r.rc == 0:  # pragma: no cover - a machine with a visible GPU
        pytest.skip("this machine has a GPU torch can see")
    assert r.rc == 2
    assert "cannot detect the platform" in r.err and "--platform" in r.err


@pytest.mark.parametrize(("query", "rc"), [(["--capability", "9.0", "--kv-cache-dtype", "fp8"], 0),
                                          (["--capability", "9.0", "--tokens", "131072"], 0),
                                          (["--capability", "10.0", "--kv-cache-dtype", "bfloat16"], 1)])
def test_a_warm_explain_loads_only_its_own_code(query, rc):
    """A cold explain is on operators' and scripts' path: with the rules compiled it imports
    neither torch, yaml nor jsonschema (the product's promise), nor the other subcommands' code,
    the compiler, ``typing`` (~7 ms) or ``shutil`` (~2 ms); a rejection's alternatives included."""
    env = environ()
    assert run("explain", "--platform", "cuda", "--capability", "9.0", env=env).rc == 0  # warm the cache
    code = ("import sys, io, contextlib\n"
            "from dsv4sel.cli import COMMANDS, main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    rc = main(['explain', '--platform', 'cuda', *{query!r}])\n"
            "others = {'dsv4sel.cli.' + c for c in COMMANDS if c != 'explain'} | {'dsv4sel.engine.compile'}\n"
            "heavy = ('torch', 'yaml', 'jsonschema', 'typing', 'shutil')\n"
            "print(rc, sorted(m for m in sys.modules if m in others or m.split('.')[0] in heavy))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.stdout.strip() == f"{rc} []", (proc.stdout, proc.stderr, SHARED_CACHE)


def test_tokens_gives_the_kv_memory_per_kind_of_layer_and_for_the_model():
    r = run("explain", "--platform", "cuda", "--capability", "9.0", "--tokens", "131072", "--json")
    assert r.rc == 0, r
    memory = json.loads(r.out)["memory"]
    assert memory["tokens"] == 131072 and memory["window"] == 128
    assert [(m["kind"], m["count"], m["per_layer"]) for m in memory["layers"]] == [
        ("swa", 2, 128 * 584), ("c4", 21, 128 * 584 + 32768 * 584 + 32768 * 132), ("c128", 20, 128 * 584 + 1024 * 584)]
    assert memory["total"] == sum(m["count"] * m["per_layer"] for m in memory["layers"])
    text = run("explain", "--platform", "cuda", "--capability", "9.0", "--tokens", "131072").out
    assert re.search(r"^  main\s+fp8_ds_mla\s+584 B/token per layer\s+block-split\s+fp8 ocp$", text, re.M), text
    assert re.search(r"^  total\s+507,874,304 B \(484\.35 MiB\)$", text, re.M), text


@pytest.mark.parametrize(("args", "says"), [
    (["--model", "deepseek_v4_1", "--input", "mega_attn=available"], "knows no layer counts for deepseek_v4_1"),
    (["--layers", "swa=2"], "give the sliding window too"),
])
def test_tokens_without_known_layers_exits_2_naming_what_to_pass(args, says):
    r = run("explain", "--platform", "cuda", "--capability", "10.0", "--tokens", "1000", *args)
    assert r.rc == 2 and says in r.err and "--layers" in r.err and r.out == "", r


def test_a_gpu_name_alone_names_the_platform_and_the_query_line_says_so():
    r = run("explain", "--capability", "MI300X")
    assert r.rc == 0, r
    assert r.out.startswith("query     rocm gfx942 (from --capability MI300X), --kv-cache-dtype auto"), r.out
    assert re.search(r"^selected\s+ROCM_FLASHMLA_SPARSE_DSV4 ", r.out, re.M)
    h100 = run("explain", "--capability", "NVIDIA H100 80GB HBM3")
    assert h100.out.startswith("query     cuda 9.0 (from --capability NVIDIA H100 80GB HBM3)"), h100.out
    # a capability every platform declares names none: the platform is still asked for
    unknown = run("explain", "--capability", "unknown")
    assert unknown.rc == 2 and "--platform is required" in unknown.err


def test_a_gpu_name_of_another_platform_says_which_platform_it_is():
    r = run("explain", "--platform", "cuda", "--capability", "MI300X")
    assert r.rc == 2 and r.out == "", r
    assert r.err.strip() == "dsv4sel explain: error: MI300X is a ROCm GPU (gfx942): use --platform rocm"
    cuda = run("explain", "--platform", "rocm", "--capability", "H100")
    assert cuda.err.strip() == "dsv4sel explain: error: H100 is a CUDA GPU (9.0): use --platform cuda"


@pytest.mark.parametrize("args, shown, hidden", [
    (("--platform", "cuda", "--capability", "9.0"), [], ["mega_attn", "prefill_context_parallel", "flashinfer_sm120"]),
    (("--platform", "cuda", "--capability", "12.0"), ["flashinfer_sm120=available"],
     ["mega_attn", "prefill_context_parallel"]),
    (("--platform", "cuda", "--capability", "10.0", "--model", "deepseek_v4_1"),
     ["mega_attn=unavailable", "prefill_context_parallel=off"], ["flashinfer_sm120"]),
    (("--platform", "rocm", "--capability", "gfx942"), [], ["mega_attn", "prefill_context_parallel", "flashinfer_sm120"]),
])
def test_the_query_line_shows_only_the_inputs_that_decide_the_query(args, shown, hidden):
    r = run("explain", *args)
    query = r.out[:r.out.index("\n\n")]  # the query line, wrapped or not
    for text in shown:
        assert text in query, query
    for name in hidden:
        assert name not in query, query
    # --json still gives every input of the query
    data = json.loads(run("explain", *args, "--json").out)
    assert {"mega_attn", "prefill_context_parallel", "flashinfer_sm120"} <= set(data["query"])


def fits(line: str, width: int) -> bool:
    """``line`` is at most ``width`` columns, or it holds one word that is wider than the room
    left beside its label (a path, a class name: never broken), and nothing after it."""
    return len(line) <= width or re.fullmatch(r"\s*(\S+( \S+)*\s{2,})?\S+", line) is not None


@pytest.mark.parametrize("args", [
    ("--platform", "cuda", "--capability", "9.0"),
    ("--platform", "cuda", "--capability", "10.0", "--kv-cache-dtype", "bfloat16"),
    ("--platform", "cuda", "--capability", "12.0", "--model", "deepseek_v4_1"),
])
def test_piped_output_fits_100_columns_and_keeps_every_location_whole(args):
    r = run("explain", *args)
    assert all(fits(line, 100) for line in r.out.splitlines()), r.out
    for rule in json.loads(run("explain", *args, "--json").out)["path"]:
        assert re.search(rf"(^|\s){re.escape(rule['location'])}(\s|$)", r.out, re.M), rule["location"]
    # a host's versions stay with its name: "(vllm >=0.33.0,<0.34)" is one word
    assert r.rc == 1 or re.search(r"\(vllm >=0\.33\.0,<0\.3[45]\)$", r.out, re.M), r.out


def test_a_narrow_terminal_wraps_without_breaking_a_path(tmp_path):
    # from another directory the shipped rules' locations are absolute paths: long words
    r = run_tty("explain", "--platform", "cuda", "--capability", "9.0", env=environ(COLUMNS="60", NO_COLOR="1"))
    assert r.rc == 0
    assert all(fits(line, 60) for line in r.out.splitlines()), r.out
    assert re.search(r"(^|\s)rules/flashmla\.yaml:\d+(\s|$)", r.out, re.M), r.out
