"""The engines' own verdicts in ``tests/tools/fleet/cases.yaml``, checked by running the engines' own code.

For every case whose ``engines.evidence`` is ``run``, each side of the deployment is decided as the
engine decides it (its release's compat rule set, ``dsv4sel fleet --as engine``) and handed to the
engine's own checks, on CPU, in the engine's environment:

- vLLM 0.33 (``tests/fleet_engines/vllm_sides.py`` in .venv-vllm): each side's layer built by vLLM,
  its NIXL compatibility hash computed by vLLM's ``compute_nixl_compatibility_hash`` over what the
  layer left in the cache config, its sliding-window cache spec and the platform's fp8 dtype. Two
  prefill/decode sides then meet as the NIXL pull worker meets them: the hashes must be equal
  (``RuntimeError`` otherwise, ``base_worker.py:1192-1208``), the block sizes divide
  (``block_size_ratio``) and a replicated region's block length over the ratio must equal the
  remote's (``AssertionError``, ``base_worker.py:2924-2929``). Two ranks of one instance meet as the
  engine core merges their specs: equal, or ``AssertionError`` at start
  (``kv_cache_planning.py:1625-1628``).
- SGLang 0.5.23 (``tests/fleet_engines/sglang_handshake.py`` in .venv-sglang): each side's PD layout
  string built by SGLang's own layout code, and decode's ``try_ensure_parallel_info`` run on
  prefill's published info.

A pair the checks let through is ``works`` when ``dsv4sel fleet`` finds the contracts equal and
``silent-misread`` when it does not; a pair they refuse is ``refused-...`` when the contracts
differ and ``spurious-refusal`` when they are equal.

Then the same checks with dsv4sel's plugins (``tests/fleet_engines/handshakes.yaml``): each side built
through the plugin (or, where its ``decided_by`` is ``engine``, without it), its handshake metadata as the
plugin makes it, and the engine's own handshake, bootstrap and start-up code meeting the sides
(``vllm_plugin_handshake.py``, ``sglang_plugin_handshake.py``; what each runs is in their docstrings).
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dsv4sel
from dsv4sel.engine.load import load_file
from dsv4sel.tools.deployment import load_deployment
from dsv4sel.tools.fleet import decide_fleet

from _host_env import env_skip_reason

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

from vllm_env import cache_root  # noqa: E402  (tools/: the vLLM environment's own cache folder)

FLEET = ROOT / "tests" / "tools" / "fleet"
SCRIPTS = ROOT / "tests" / "fleet_engines"
VENVS = {"vllm": ROOT / ".venv-vllm", "sglang": ROOT / ".venv-sglang"}
SKIP = {
    "vllm": env_skip_reason("vLLM 0.33.0", VENVS["vllm"], VENVS["vllm"] / ".dsv4sel-vllm-env", "vllm-env",
                            "tools/vllm_env.py"),
    "sglang": env_skip_reason("SGLang 0.5.23", VENVS["sglang"], VENVS["sglang"] / ".dsv4sel-sglang-env",
                              "sglang-env", "tools/sglang_env.py"),
}


def _cases() -> list[dict]:
    loaded, problems = load_file(str(FLEET / "cases.yaml"), "cases.yaml")
    assert loaded is not None and not problems, problems
    return [c for c in loaded.data["cases"] if c["engines"]["evidence"] == "run"]


RUN = _cases()


def _engine(case: dict) -> str:
    return load_deployment(str(FLEET / case["file"])).sides[0].engine


def _report(case: dict):
    return decide_fleet(load_deployment(str(FLEET / case["file"])), dsv4sel.default_rules(), "engine", search=False)


def _roles(case: dict) -> tuple[str, str]:
    """(prefill, decode) side names: by their disaggregation roles, else the file's order."""
    sides = load_deployment(str(FLEET / case["file"])).sides
    by_role = {s.disaggregation: s.name for s in sides if s.disaggregation}
    return (by_role["prefill"], by_role["decode"]) if len(by_role) == 2 else (sides[0].name, sides[1].name)


def _run(engine: str, script: str, job: dict, tmp: Path) -> dict:
    path = tmp / f"{script.removesuffix('.py')}-{job.get('platform', 'cuda')}.json"
    path.write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSV4SEL_", "VLLM_", "SGLANG_"))}
    env.update(PYTHONPATH=str(ROOT), NO_COLOR="1")
    if engine == "vllm":
        env["VLLM_CACHE_ROOT"] = str(cache_root(VENVS[engine]))
    proc = subprocess.run([str(VENVS[engine] / "bin" / "python"), str(SCRIPTS / script), str(path)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@functools.lru_cache(maxsize=1)
def _vllm_results(tmp: Path) -> dict:
    jobs: dict[str, list] = {}
    for case in RUN:
        if _engine(case) != "vllm":
            continue
        deployment = load_deployment(str(FLEET / case["file"]))
        for side in deployment.sides:
            jobs.setdefault(side.get("platform"), []).append({
                "id": f"{case['file']}:{side.name}", "model": side.model or deployment.model,
                "capability": side.get("capability"), "backend": side.get("attention_backend"),
                "kv": side.get("kv_cache_dtype") or "auto", "mega": side.get("mega_attn") == "available",
                "model_path": side.checkpoint or "/models/DeepSeek-V4", "version": side.version})
    out: dict = {}
    for platform, sides in jobs.items():
        out.update(_run("vllm", "vllm_sides.py", {"platform": platform, "sides": sides}, tmp))
    return out


@functools.lru_cache(maxsize=1)
def _sglang_results(tmp: Path) -> dict:
    pairs = []
    for case in RUN:
        if _engine(case) != "sglang":
            continue
        report, (prefill, decode) = _report(case), _roles(case)
        told = {s.name: {**dict(s.outcome.told), "model": s.model,
                         "compressed": dict(s.side.env).get("SGLANG_DSV4_COMPRESSED_KV_LAYOUT", "auto")}
                for s in report.sides}
        pairs.append({"id": case["file"], "prefill": told[prefill], "decode": told[decode]})
    return _run("sglang", "sglang_handshake.py", {"platform": "rocm", "arch": "gfx942", "pairs": pairs}, tmp)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fleet-engines")


def _vllm_verdict(case: dict, results: dict) -> tuple[str, str]:
    """(passes or refused, why) for a vLLM pair, by the checks vLLM runs on what its code produced."""
    prefill, decode = (results[f"{case['file']}:{name}"] for name in _roles(case))
    for side in (prefill, decode):
        assert "error" not in side, side
    if not any(s.disaggregation for s in load_deployment(str(FLEET / case["file"])).sides):
        # ranks of one instance: the engine core compares the workers' specs of each layer
        if prefill["spec"] != decode["spec"]:
            return "refused-at-start", "The KV cache specs for the same layer are different across workers"
        return "passes", "equal KV cache specs"
    if prefill["hash"] != decode["hash"]:
        return "refused", f"NIXL compatibility hash mismatch ({prefill['cache_dtype']} / {decode['cache_dtype']})"
    if decode["block_size"] % prefill["block_size"]:
        return "refused", "block sizes do not divide"
    ratio = decode["block_size"] // prefill["block_size"]
    if decode["swa_page"] // ratio != prefill["swa_page"]:
        return "refused", f"KV cache sizes must match ({decode['swa_page']} // {ratio} != {prefill['swa_page']})"
    return "passes", f"hash and block lengths equal; fp8 {prefill['fp8_dtype']} / {decode['fp8_dtype']}"


def _verdict(check: str, compatible: bool) -> str:
    if check == "passes":
        return "works" if compatible else "silent-misread"
    if check == "refused-at-start":
        return check
    return "refused-at-first-request" if not compatible else "spurious-refusal"


def _compatible(case: dict) -> bool:
    """Whether ``dsv4sel fleet`` finds the contracts equal; sides of two releases never are (and a release
    without a compat rule set is not decided at all)."""
    sides = load_deployment(str(FLEET / case["file"])).sides
    if len({(s.engine, s.version) for s in sides}) > 1:
        return False
    return _report(case).compatible


@pytest.mark.parametrize("case", RUN, ids=lambda c: c["file"].removesuffix(".yaml"))
def test_the_engines_own_checks_give_the_recorded_verdict(case, workdir):
    engine = _engine(case)
    if SKIP[engine]:
        pytest.skip(SKIP[engine])
    compatible = _compatible(case)
    if engine == "vllm":
        check, why = _vllm_verdict(case, _vllm_results(workdir))
    else:
        got = _sglang_results(workdir)["pairs"][case["file"]]
        check, why = ("passes", got["prefill_layout"]) if got["verdict"] == "passes" else ("refused", got["verdict"])
    assert _verdict(check, compatible) == case["engines"]["verdict"], (why, compatible)


def test_gfx942_reads_the_cache_as_fnuz_in_both_engines(workdir):
    """The fp8 flavour dsv4sel's contract names: what each engine's own code reads on gfx942."""
    if SKIP["sglang"] or SKIP["vllm"]:
        pytest.skip(SKIP["sglang"] or SKIP["vllm"])
    assert _sglang_results(workdir)["fp8_dtype"] == "float8_e4m3fnuz"
    vllm = _vllm_results(workdir)
    assert vllm["row13_vllm_cuda_gfx942.yaml:decode"]["fp8_dtype"] == "float8_e4m3fnuz"
    assert vllm["row13_vllm_cuda_gfx942.yaml:prefill"]["fp8_dtype"] == "float8_e4m3fn"
    assert vllm["row13b_vllm_gfx950_gfx942.yaml:prefill"]["fp8_dtype"] == "float8_e4m3fn"


# ------------------------------------------------------------------ through dsv4sel's plugins

TESTS = ROOT / "tests"
DOC = ROOT / "docs" / "deployments.md"


def _handshakes() -> list[dict]:
    loaded, problems = load_file(str(SCRIPTS / "handshakes.yaml"), "handshakes.yaml")
    assert loaded is not None and not problems, problems
    return loaded.data["cases"]


HANDSHAKES = _handshakes()


@functools.lru_cache(maxsize=None)
def _plugin_report(file: str):
    """``dsv4sel fleet`` as dsv4sel decides (what the plugins do), and the deployment."""
    deployment = load_deployment(str(TESTS / file))
    return decide_fleet(deployment, dsv4sel.default_rules(), "dsv4sel", search=False), deployment


def _meeting(deployment) -> tuple[str, list[str]]:
    """How the sides meet: ``pair`` (prefill, decode), ``ranks`` (in the file's order)."""
    roles = {s.disaggregation for s in deployment.sides}
    names = [s.name for s in deployment.sides]
    if roles == {"prefill", "decode"}:
        return "pair", [_role(deployment, "prefill"), _role(deployment, "decode")]
    return "ranks", names


def _role(deployment, role: str) -> str:
    return next(s.name for s in deployment.sides if s.disaggregation == role)


def _vllm_side(file: str, side, model: str) -> dict:
    return {"id": f"{file}:{side.name}", "model": side.model or model, "capability": side.get("capability"),
            "backend": side.get("attention_backend"), "kv": side.get("kv_cache_dtype") or "auto",
            "mega": side.get("mega_attn") == "available", "model_path": side.checkpoint or "/models/DeepSeek-V4",
            "plugin": side.decided_by != "engine"}


def _sglang_side(file: str, side, model: str, told: dict) -> dict:
    env = dict(side.env)
    point = {"model": side.model or model, "platform": side.get("platform"),
             "capability": side.get("capability") or "unknown",
             "dsv4_attn_backend": side.get("attention_backend") or "auto",
             "kv_cache_dtype": side.get("kv_cache_dtype") or "auto",
             "kv_layout_env": env.get("SGLANG_DSV4_KV_LAYOUT", "unset").lower() or "unset",
             "deployment": side.get("deployment") or ("pd" if side.disaggregation else "single")}
    if point["platform"] == "rocm":
        point["hip_kernel"] = env.get("SGLANG_HACK_FLASHMLA_BACKEND", "auto")
    return {"id": f"{file}:{side.name}", "model": point["model"], "point": point, "env": env, "told": told,
            "plugin": side.decided_by != "engine"}


def _engine_of(file: str) -> str:
    return _plugin_report(file)[1].sides[0].engine


@functools.lru_cache(maxsize=None)
def _plugin_results(engine: str, tmp: Path) -> dict:
    """One engine process for every case of ``engine``."""
    job: dict = {"sides": [], "pairs": [], "ranks": []}
    for case in HANDSHAKES:
        if _engine_of(case["file"]) != engine:
            continue
        report, deployment = _plugin_report(case["file"])
        for s in report.sides:
            job["sides"].append(_vllm_side(case["file"], s.side, deployment.model) if engine == "vllm" else
                                _sglang_side(case["file"], s.side, deployment.model, dict(s.outcome.told)))
        if any(s.outcome.contract is None for s in report.sides):
            continue  # a side the rules refuse: the plugin stops it before any handshake
        how, names = _meeting(deployment)
        ids = [f"{case['file']}:{name}" for name in names]
        if how == "pair":
            job["pairs"].append({"id": case["file"], "prefill": ids[0], "decode": ids[1]})
        else:
            job["ranks"].append({"id": case["file"], "workers": ids})
    script = "vllm_plugin_handshake.py" if engine == "vllm" else "sglang_plugin_handshake.py"
    return _run(engine, script, job, tmp)


def _plugin_verdict(case: dict, results: dict) -> tuple[str, str]:
    """(verdict, the message of a refusal) from what the engine's code did with the plugins' sides."""
    report, deployment = _plugin_report(case["file"])
    for s in report.sides:
        refused = results["sides"][f"{case['file']}:{s.name}"].get("refused")
        if refused:
            return "refused-at-start", refused
    if case["file"] in results["pairs"]:
        pair = results["pairs"][case["file"]]
        if _engine_of(case["file"]) == "vllm":  # the escape hatch still turns the check off
            assert pair["escape_hatch"] == "passes", pair
        return ("works", "") if pair["verdict"] == "passes" else ("refused-at-first-request", pair["verdict"])
    ranks = results["ranks"][case["file"]]
    if _engine_of(case["file"]) == "vllm":
        refusal = next((r for r in (ranks["start"], ranks["merge"]) if r != "passes"), None)
        return ("works", "") if refusal is None else ("refused-at-start", refusal)
    refused = [r for r in ranks["registered"] if r["status"] != 200]
    if not refused:
        assert ranks["route"]["status"] == 200, ranks
        return "works", ""
    # the rank is not registered, and decode's query gets the same refusal
    assert ranks["route"] == refused[0] and ranks["route"]["status"] == 400, ranks
    return "refused-at-start", refused[0]["text"]


def _wire(results: dict, side_id: str) -> str:
    """A side's handshake string: its NIXL hash (vLLM) or PD layout (SGLang)."""
    side = results["sides"][side_id]
    return side.get("hash") or side["kv_layout"]


@pytest.mark.parametrize("case", HANDSHAKES, ids=lambda c: Path(c["file"]).stem)
def test_the_plugins_make_the_engines_own_checks_hold_the_sides_to_one_contract(case, workdir):
    from dsv4sel.dsv4.contract import wire_fields

    engine = _engine_of(case["file"])
    if SKIP[engine]:
        pytest.skip(SKIP[engine])
    results = _plugin_results(engine, workdir)
    report, deployment = _plugin_report(case["file"])
    verdict, message = _plugin_verdict(case, results)
    assert verdict == case["verdict"], message
    plugin_sides = [s for s in report.sides if s.side.decided_by != "engine" and s.outcome.contract is not None]
    for s in plugin_sides:  # what the plugin carries is the contract `dsv4sel fleet` decides for that side
        assert wire_fields(_wire(results, f"{case['file']}:{s.name}"))["fingerprint"] == s.outcome.contract.fingerprint
    if verdict == "works" or "refused" in results["sides"].get(f"{case['file']}:{report.sides[0].name}", {}):
        return
    if len(plugin_sides) < len(report.sides):  # the refusal says which side runs without dsv4sel
        assert message.count("dsv4sel contract") == len(plugin_sides) or "without dsv4sel" in message or (
            "no dsv4sel decision" in message), message
        return
    checkpoints = {s.checkpoint for s in deployment.sides}
    assert not report.compatible or len(checkpoints) > 1, "the plugins refuse sides dsv4sel fleet finds compatible"
    for difference in report.differences:  # every differing field, with each side's value
        if not difference.field.endswith(".encoding"):
            assert difference.field in message, (difference.field, message)
            for value in dict(difference.values).values():
                assert str(value) in message, (difference.field, value, message)


def _all_dsv4sel(case: dict) -> bool:
    """Every side runs dsv4sel, on one checkpoint path (a side without dsv4sel is refused whatever its
    contract; vLLM hashes the model path)."""
    sides = load_deployment(str(TESTS / case["file"])).sides
    return all(s.decided_by != "engine" for s in sides) and len({s.checkpoint for s in sides}) == 1


@pytest.mark.parametrize("case", [c for c in HANDSHAKES if _all_dsv4sel(c)], ids=lambda c: Path(c["file"]).stem)
def test_with_dsv4sel_on_every_side_the_engines_refuse_exactly_what_fleet_refuses(case, workdir):
    engine = _engine_of(case["file"])
    if SKIP[engine]:
        pytest.skip(SKIP[engine])
    report, _ = _plugin_report(case["file"])
    verdict, _ = _plugin_verdict(case, _plugin_results(engine, workdir))
    assert (verdict == "works") == report.compatible


def _doc_examples() -> list[tuple[str, str]]:
    """docs/deployments.md's refusal examples: (deployment file, the block shown)."""
    import re

    found = re.findall(r"<!-- handshake refusal: (\S+) -->\n```text\n(.*?)\n```", DOC.read_text(), re.S)
    assert len(found) == 6, found
    return found


EXAMPLES = _doc_examples()


@pytest.mark.parametrize("file,shown", EXAMPLES, ids=[Path(file).stem for file, _ in EXAMPLES])
def test_the_docs_show_the_refusals_the_engines_give(file, shown, workdir):
    case = next(c for c in HANDSHAKES if c["file"] == file)
    engine = _engine_of(file)
    if SKIP[engine]:
        pytest.skip(SKIP[engine])
    _, message = _plugin_verdict(case, _plugin_results(engine, workdir))
    assert shown == message, f"docs/deployments.md's example for {file} is stale; the engine now gives:\n{message}"
