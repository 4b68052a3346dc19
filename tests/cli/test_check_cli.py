"""``dsv4sel check`` as a user runs it: a subprocess, real exit status."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest



REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).with_name("dsv4sel")
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [
    sys.executable, "-c", "import sys; from dsv4sel.cli import main; sys.exit(main())"]


def check(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("DSV4SEL_RULES_PATH", None)  # the default rule set, exactly
    proc = subprocess.run([*COMMAND, "check", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    return proc


#: the small rule set (tests/rules/small/: a vocabulary, everything to backend A) and A's tables
SMALL = REPO / "tests" / "rules" / "small"
RULES = Path(__file__).with_name("rules") / "check_cli"


def write(directory: Path, *folders: Path) -> Path:
    """``directory`` holding the rule files of ``folders`` (none: an empty directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    for folder in folders:
        shutil.copytree(folder, directory, dirs_exist_ok=True)
    return directory


@pytest.fixture(scope="module")
def shipped():
    return check()


def test_shipped_rules_are_clean(shipped):
    assert shipped.returncode == 0, shipped.stdout
    assert "clean:" in shipped.stdout.splitlines()[-1]


def test_shipped_rules_report_coverage(shipped):
    out = shipped.stdout
    match = re.search(r"coverage: (\d+) points x (\d+) backend choices .* = (\d+) inputs", out)
    assert match and int(match[1]) * int(match[2]) == int(match[3])
    totals = re.search(r"select (\d+), reject (\d+), undecided (\d+)", out)
    assert int(totals[1]) + int(totals[2]) + int(totals[3]) == int(match[3]) and totals[3] == "0"
    assert re.search(r"^  <none>\s+<default-backend decision>\s+\d+\s+\d+\s+0$", out, re.M)
    assert re.search(r"^  not-a-dsv4-backend\s+rules/not_dsv4.yaml:\d+\s+reject\s+\d+\s+\d+$", out, re.M)


def test_summary_is_one_line_for_clean_rules_and_keeps_every_finding():
    clean = check("--summary")
    assert clean.returncode == 0, clean.stdout
    assert re.fullmatch(r"dsv4sel check: clean, \d+ files, \d+ rules: all \d+ inputs decided exactly once\n",
                        clean.stdout), clean.stdout


def test_summary_of_rules_with_findings_lists_them_then_one_line(tmp_path):
    rules = write(tmp_path / "gappy", SMALL, RULES / "gappy")
    proc = check("--only-rules", "--rules", str(rules), "--summary", cwd=tmp_path)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert [re.match(r"(\S+): error (DSV\d+) ", line).groups() for line in lines[:-1]] == [
        ("gappy/a.yaml:2", "DSV401"), ("gappy/a.yaml:2", "DSV401"), ("gappy/a.yaml:12", "DSV402")], lines
    assert re.fullmatch(r"dsv4sel check: \d+ files, \d+ rules: 3 findings: 3 errors, 0 warnings", lines[-1]), lines
    assert "coverage:" not in proc.stdout


def test_bad_rule_dir_gives_locations_and_exit_2(tmp_path):
    # rule files that do not load are unusable input: exit 2, as from every command
    rules = write(tmp_path / "bad", SMALL, RULES / "typo")
    proc = check("--only-rules", "--rules", str(rules), cwd=tmp_path)
    assert proc.returncode == 2
    assert re.findall(r"^(\S+): error (DSV\d+) ", proc.stdout, re.M) == [("bad/a.yaml:13:28", "DSV301")], proc.stdout
    assert proc.stdout.rstrip().endswith("the decision space was not analysed: fix the problems above first")


def test_gap_and_overlap_with_counterexamples(tmp_path):
    rules = write(tmp_path / "gappy", SMALL, RULES / "gappy")
    proc = check("--only-rules", "--rules", str(rules), cwd=tmp_path)
    assert proc.returncode == 1
    out = proc.stdout
    # each finding one line: location, severity, code, [kind], the message (its wording: tests/engine/wording.yaml)
    assert re.findall(r"^(\S+): error (DSV\d+) \[(\w+)\] ", out, re.M) == [
        ("gappy/a.yaml:2", "DSV401", "gap"), ("gappy/a.yaml:2", "DSV401", "gap"), ("gappy/a.yaml:12", "DSV402", "overlap")]
    # the paths in a message are as given too, and a cube ends the line
    assert re.search(r"^gappy/a.yaml:12: .* \(gappy/a.yaml:15\) .*: platform=cuda backend=A kv_cache_dtype=fp8$", out, re.M)
    # a cube names only the inputs that narrow it, as diff's do: no `name=*`
    assert "platform=rocm kv_cache_dtype=auto" in out and "=*" not in out
    assert "    e.g.:    model=m platform=cuda capability=9.0 backend=A kv_cache_dtype=fp8" in out
    assert out.rstrip().endswith("findings: 3 errors, 0 warnings")


def test_json_output(tmp_path):
    rules = write(tmp_path / "ok", SMALL, RULES / "reject_all")
    proc = check("--only-rules", "--rules", str(rules), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout
    data = json.loads(proc.stdout)
    assert data["ok"] is True and data["findings"] == []
    # 7 platform/capability pairs x 4 dtypes, asked with no backend and with A
    assert data["coverage"]["totals"] == {"select": 0, "reject": 56, "undecided": 0, "total": 56}


def test_unusable_input_exits_2(tmp_path):
    missing = check("--rules", str(tmp_path / "missing"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr and missing.stdout == ""
    empty = check("--only-rules", "--rules", str(write(tmp_path / "empty")))
    assert empty.returncode == 2 and "no rule files" in empty.stderr
    bare = check("--only-rules")
    assert bare.returncode == 2 and "--only-rules needs" in bare.stderr
