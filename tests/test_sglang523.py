"""Differential suite against the real SGLang 0.5.23 (installed in .venv-sglang by `make sglang-env`).

Each platform runs in its own process of the SGLang environment (SGLang fixes its platform on
first import): ``tests/sglang523/differential.py PLATFORM`` enumerates the whole host space there
and asks SGLang's own resolution pipeline, layout function, pool and backend factory, and the
compat rule set. The assertions here read its report. Skipped, with the reason, when the
environment is missing (``make test`` builds it first; a failed build leaves .venv-sglang.log).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("DSV4SEL_SGLANG_VENV", ROOT / ".venv-sglang"))
PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".dsv4sel-sglang-env"
COMPAT = ROOT / "rules" / "compat" / "sglang-0.5.23"
PLATFORMS = ("cuda", "rocm")


def _skip_reason() -> str | None:
    if not STAMP.exists():
        log = ROOT / ".venv-sglang.log"
        why = f"; its build log: {log}" if log.exists() else ""
        return (f"the SGLang 0.5.23 test environment {VENV} is not built (run `make sglang-env`: "
                f"`python3 tools/sglang_env.py`){why}")
    return None


def test_the_compat_generator_is_not_stale():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_compat_sglang0523.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_compat_set_is_clean():
    from dsv4sel import verify

    report = verify([str(COMPAT)])
    assert report.ok and not report.findings, [f.message for f in report.findings][:5]


needs_env = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("sglang523")

    def run(platform):
        path = out / f"{platform}.json"
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.run([str(PYTHON), str(ROOT / "tests" / "sglang523" / "differential.py"), platform,
                               "--compat", str(COMPAT), "--out", str(path)],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
        assert proc.returncode == 0, f"{platform}: differential run failed:\n{proc.stderr[-4000:]}"
        return platform, json.loads(path.read_text())

    with ThreadPoolExecutor(max_workers=2) as pool:
        found = dict(pool.map(run, PLATFORMS))
    summary = {p: {k: r[k] for k in ("inputs", "stages", "seconds")} | {"compat": {
        "agree": r["compat"]["agree"], "disagree": r["compat"]["disagree"]}} for p, r in found.items()}
    (ROOT / ".pytest_cache").mkdir(exist_ok=True)
    (ROOT / ".pytest_cache" / "sglang523-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    sys.stderr.write("\nSGLang 0.5.23 differential: " + json.dumps(summary) + "\n")
    return found


@needs_env
@pytest.mark.parametrize("platform", PLATFORMS)
def test_sglang_decides_every_input_it_was_asked(reports, platform):
    r = reports[platform]
    assert r["inputs"] == sum(r["stages"].values()) > 0
    # SGLang serves some inputs, refuses some at start-up and some only after the weights load
    assert set(r["stages"]) == {"ok", "config", "late"}


@needs_env
@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_compat_set_agrees_with_sglang_everywhere(reports, platform):
    c = reports[platform]["compat"]
    assert c["disagree"] == 0, json.dumps(c["examples"][:3], indent=1)
    assert c["agree"] == reports[platform]["inputs"]


@needs_env
def test_sglang_records_have_the_geometry_of_dsv4sel_layouts():
    """SGLang's own KVLayout sizes (bytes per token, page bytes at 64/128/256 tokens) equal those of
    the dsv4sel layout that stores the same record; V4.1's two arrangements share one size."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([str(PYTHON), str(ROOT / "tests" / "sglang523" / "bytes.py")], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sizes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(sizes) == {"V4", "V41", "V41_NEW", "V41_FP4", "UNIFORM_FP8"}
    for name, row in sizes.items():
        assert row["sglang"] == row["ours"], (name, row)
    assert sizes["V4"]["sglang"][0] == 584 and sizes["V4"]["sglang"][3] == 149_760
