"""The processes of the vLLM 0.33 suite, started together once per pytest session.

Each vLLM process imports vLLM (about 10 s of CPU) and the differential's five take most of the
suite's time, so the test files do not run them one after another: the first vLLM test's fixture
calls :func:`start`, which launches every process the collected test files need (the
differential's five, the host check, the plugin scenarios, one ``vllm serve``, the pip resolver
run) on a bounded pool, longest first; each test file then waits only for its own results.
Every process gets its own temporary directory and dsv4sel cache directory (the differential's
five share one, compiled once before they start: only read there). No result depends on timing.
"""
from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from _host_env import env_skip_reason

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("DSV4SEL_VLLM_VENV", ROOT / ".venv-vllm"))
PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".dsv4sel-vllm-env"
COMPAT = ROOT / "rules" / "compat" / "vllm-0.33"
SCRIPTS = ROOT / "tests" / "vllm33"
#: the packs the host suite loads, as YAML files: nosuch/ (a vLLM class vLLM does not have), demo/
#: (a backend whose impl lives in the pack's own module, and its default rule)
RULES = ROOT / "tests" / "hosts" / "vllm" / "rules"
PLATFORMS = ("cuda", "rocm", "cpu", "xpu")
#: The differential's processes: (platform, model or None for every model), longest first. CUDA's
#: space is split by model so that the longest run is not one process.
RUNS = (("cuda", "deepseek_v4_1"), ("cuda", "deepseek_v4"), ("rocm", None), ("cpu", None), ("xpu", None))
#: Environment variables a user may have set that would change what the processes decide.
USER_ENV = ("DSV4SEL_RULES_PATH", "DSV4SEL_ALLOW_IMPL_MODULES", "VLLM_PLUGINS", "VLLM_LOGGING_LEVEL",
            "VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_CONFIG_PATH")
#: At most this many vLLM processes at once (each holds about 0.7 GB).
WORKERS = 8

_jobs: dict[str, Future] = {}
_pool: list[ThreadPoolExecutor] = []


def skip_reason() -> str | None:
    return env_skip_reason("vLLM 0.33.0", VENV, STAMP, "vllm-env", "tools/vllm_env.py")


def clean_env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in USER_ENV and not k.startswith("DSV4SEL_TEST_")}
    env.update(PYTHONPATH=str(ROOT), DSV4SEL_CACHE_DIR=str(cache), NO_COLOR="1")
    env.update(extra)
    return env


def run(args: list, env: dict, cwd: Path = ROOT, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(PYTHON), *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, check=False,
                          timeout=timeout)


# ------------------------------------------------------------------ the differential
def _differential(out: Path, cache: Path, warm: Future, platform: str, model: str | None) -> dict:
    warm.result()
    path = out / f"{platform}-{model or 'all'}.json"
    rules = ["--rules", f"compat={COMPAT}"] if COMPAT.is_dir() else []
    proc = run([SCRIPTS / "differential.py", platform, *(["--model", model] if model else []), *rules,
                "--out", path], clean_env(cache))
    assert proc.returncode == 0, f"{platform}: differential run failed:\n{proc.stderr[-4000:]}"
    return json.loads(path.read_text())


def _warm_cache(cache: Path) -> None:
    """Compile the rule sets the differential reads into its cache, once (each of its processes
    would otherwise compile the compat set itself)."""
    code = "import sys, dsv4sel; dsv4sel.default_rules(); [dsv4sel.load_rules(paths=[p]) for p in sys.argv[1:]]"
    proc = run(["-c", code, *([COMPAT] if COMPAT.is_dir() else [])], clean_env(cache))
    assert proc.returncode == 0, proc.stderr[-3000:]


# ------------------------------------------------------------------ the host check
def _hostcheck(out: Path) -> dict:
    """``dsv4sel check``'s host check on a ROCm platform object, for the shipped rules and for the
    shipped rules plus a pack naming a class vLLM does not have."""
    pack = RULES / "nosuch"  # X_DSV4 names vllm.models.deepseek_v4.nvidia.flashmla:NoSuchAttention
    proc = run([SCRIPTS / "hostcheck.py", "rocm", "--rules", pack], clean_env(out / "cache"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ the plugin scenarios
def _models(out: Path) -> tuple[Path, Path, Path]:
    """Tiny Hugging Face configs (no weights), a DeepSeek-V4 and a Llama model written in one
    process, and the pack: ``(models, pack rules, pack source)``."""
    models = out / "models"
    proc = run([SCRIPTS / "plugin_scenarios.py", "model", models / "v4", "DeepseekV4ForCausalLM",
                models / "llama", "LlamaForCausalLM"], clean_env(out / "cache"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return (models, *pack(out / "demo"))


def pack(directory: Path) -> tuple[Path, Path]:
    """A rule pack whose backend's impl lives in the pack's own module (not dsv4sel.kernels):
    ``(rules directory, source directory)``."""
    module = directory / "src" / "demo_dsv4_kernels"
    module.mkdir(parents=True)
    (module / "__init__.py").write_text(
        "from dsv4sel.kernels.base import SparseMLAImpl\n\n\n"
        "class DemoSparseImpl(SparseMLAImpl):  # an impl subclasses SparseMLAImpl, or it is none\n"
        "    '''A pack's own kernel.'''\n\n"
        "    @classmethod\n"
        "    def import_library(cls):\n"
        "        raise ImportError('no kernel library here')\n\n"
        "    def run_library(self, plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink):\n"
        "        raise NotImplementedError\n")
    return RULES / "demo", directory / "src"


def scenario(directory: Path, args: list, platform: str | None = "cuda", capability: str = "9.0", script="plugin",
             **env: str) -> tuple[int, list[str], list[dict], str]:
    """One scenario process (``plugin_scenarios.py`` or, with ``script="serve"``, vLLM's own CLI):
    (exit status, its dsv4sel log lines, its JSON result lines, stderr)."""
    extra = dict(env)
    if platform:
        extra.update(DSV4SEL_TEST_PLATFORM=platform, DSV4SEL_TEST_CAPABILITY=capability)
    file = SCRIPTS / ("serve.py" if script == "serve" else "plugin_scenarios.py")
    proc = run([file, *args], clean_env(directory / "cache", **extra), cwd=directory, timeout=600)
    text = proc.stdout + proc.stderr
    lines = [line for line in text.splitlines() if "dsv4sel" in line and "== config" not in line]
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, lines, out, proc.stderr


def _scenarios(out: Path, models: Future) -> dict[str, tuple]:
    """The jobs of the plugin scenarios, by name: ``(args, keywords for scenario())``."""
    m, rules, src = models.result()
    pack_env = {"DSV4SEL_RULES_PATH": str(rules), "PYTHONPATH": f"{ROOT}{os.pathsep}{src}"}
    return {
        # four engine configurations in one process (vLLM loads the plugins once per process)
        "configs": (["config", m / "v4", "+", m / "v4", "--kv-cache-dtype", "bfloat16", "+",
                     m / "v4", "--attention-backend", "CUTLASS_MSA", "+", m / "llama"], {}),
        "no-platform": (["load"], {"platform": None}),
        "no-platform-asked": (["load"], {"platform": None, "VLLM_PLUGINS": "dsv4sel"}),
        "version": (["load"], {"DSV4SEL_TEST_FAKE_VERSION": "0.34.0"}),
        "version-asked": (["load"], {"DSV4SEL_TEST_FAKE_VERSION": "0.34.0", "VLLM_PLUGINS": "dsv4sel"}),
        "pack": (["config", m / "v4"], pack_env),
        "pack-allowed": (["config", m / "v4"], {**pack_env, "DSV4SEL_ALLOW_IMPL_MODULES": "demo_dsv4_kernels"}),
        # vLLM's own `vllm serve` (SM90 stubbed): its start-up and decision lines, docs/vllm.md
        "serve": (["serve", m / "v4", "--max-model-len", "1024", "--load-format", "dummy", "--skip-tokenizer-init"],
                  {"script": "serve"}),
    }


def _one_scenario(out: Path, models: Future, name: str) -> tuple:
    args, kw = _scenarios(out, models)[name]
    directory = out / name
    directory.mkdir()
    return scenario(directory, args, **kw)


SCENARIOS = ("serve", "configs", "no-platform", "no-platform-asked", "version", "version-asked", "pack",
             "pack-allowed")


# ------------------------------------------------------------------ the pack layer (issue 33)
#: the example pack, and the packs of the pack-layer cases (their own code under packs/)
B12X_PACK = ROOT / "examples" / "b12x-pack"
PACKS = ROOT / "tests" / "hosts" / "vllm" / "packs"


def _pack_layer(out: Path) -> dict[str, dict]:
    """``tests/vllm33/pack_layer.py`` in one process: its JSON lines by case."""
    models = out / "models"
    proc = run([SCRIPTS / "plugin_scenarios.py", "model", models / "v4", "DeepseekV4ForCausalLM", models / "llama",
                "LlamaForCausalLM"], clean_env(out / "cache"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rules = [B12X_PACK / "dsv4sel_b12x" / "rules", RULES / "torchref", RULES / "ownlayer"]
    env = clean_env(out / "cache", DSV4SEL_RULES_PATH=os.pathsep.join(map(str, rules)),
                    DSV4SEL_ALLOW_IMPL_MODULES="dsv4sel_b12x,ownlayer_pack",
                    PYTHONPATH=os.pathsep.join(map(str, (ROOT, B12X_PACK, PACKS))))
    proc = run([SCRIPTS / "pack_layer.py", models / "v4", models / "llama"], env, cwd=out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {d["case"]: d for d in (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))}


# ------------------------------------------------------------------ pip's resolver
def _install(out: Path) -> dict:
    proc = run([SCRIPTS / "extra_resolve.py", ROOT, out / "standins"], clean_env(out / "cache"), cwd=out,
               timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ starting and waiting
def start(session, tmp_path_factory) -> None:
    """Launch every process the collected vLLM test files need (once per session)."""
    if not _pool:
        launch({getattr(item.module, "__name__", "") for item in session.items}, tmp_path_factory.mktemp("vllm33"))


def launch(collected: set[str], root: Path) -> None:
    """Launch the processes of the test files named in ``collected`` (module names), under ``root``."""
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    _pool.append(pool)
    if "test_vllm33" in collected:
        out = root / "differential"
        out.mkdir()
        warm = pool.submit(_warm_cache, out / "cache")
        for platform, model in RUNS:
            _jobs[f"differential:{platform}:{model}"] = pool.submit(_differential, out, out / "cache", warm,
                                                                   platform, model)
    if "test_vllm33_plugin" in collected:
        out = root / "plugin"
        out.mkdir()
        models = pool.submit(_models, out)
        for name in SCENARIOS:
            _jobs[f"scenario:{name}"] = pool.submit(_one_scenario, out, models, name)
    if "test_vllm33" in collected:
        (root / "hostcheck").mkdir()
        _jobs["hostcheck"] = pool.submit(_hostcheck, root / "hostcheck")
    if "test_vllm33_pack_layer" in collected:
        (root / "pack_layer").mkdir()
        _jobs["pack_layer"] = pool.submit(_pack_layer, root / "pack_layer")
    if "test_vllm33_install" in collected:
        (root / "install").mkdir()
        _jobs["install"] = pool.submit(_install, root / "install")


def result(name: str):
    return _jobs[name].result()
