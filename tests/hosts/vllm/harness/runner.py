"""The vLLM processes of the host suite, started together once per pytest session, per release.

Each vLLM process imports vLLM (several seconds of CPU, most of it torch and transformers, which
the release's zygote imports once: :mod:`harness.zygote`) and the differential's five take most of
the suite's time, so the test files do not run them one after another: the first vLLM test's fixture
calls :func:`start`, which launches every process the collected test files need, for every
release collected (the differential's five, the host check, the plugin scenarios, one ``vllm
serve``, the pip resolver run), on one bounded pool, longest first; each test then waits only for
its own results. Every process runs in its release's environment with its own temporary
directory and dsv4sel cache directory (the differential's five share one, compiled once before
they start: only read there), under :mod:`harness.limits`' time limits. No result depends on timing.
"""
from __future__ import annotations

import json
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from harness import limits
from harness.releases import ROOT, VllmRelease, of_package
from harness.zygote import VLLM_PRELOAD, Zygote, preload_env

SCRIPTS = Path(__file__).resolve().parent
#: the packs the host suite loads, as YAML files: nosuch/ (a vLLM class vLLM does not have), demo/
#: (a backend whose impl lives in the pack's own module, and its default rule)
RULES = SCRIPTS.parent / "rules"
PLATFORMS = ("cuda", "rocm", "cpu", "xpu")
#: The differential's processes: (platform, model or None for every model), longest first. One per
#: platform (vLLM fixes its platform at import): each process pays vLLM's import, about 10 s of CPU,
#: which splitting CUDA's space by model paid twice on a machine whose cores the suite keeps busy.
RUNS = (("cuda", None), ("rocm", None), ("cpu", None), ("xpu", None))
#: Environment variables a user may have set that would change what the processes decide.
USER_ENV = ("DSV4SEL_RULES_PATH", "DSV4SEL_ALLOW_IMPL_MODULES", "VLLM_PLUGINS", "VLLM_LOGGING_LEVEL",
            "VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_CONFIG_PATH")
#: At most this many vLLM processes at once (each holds about 0.7 GB), over all pytest-xdist workers.
WORKERS = 8
#: The test modules of a release folder, by what they need run.
DIFFERENTIAL, PLUGIN, INSTALL, PACK_LAYER = "test_differential", "test_plugin", "test_install", "test_pack_layer"

_jobs: dict[tuple[str, str], Future] = {}
_pool: list[ThreadPoolExecutor] = []
#: The test modules whose processes this pytest process launched ("*": every collected one).
_launched: set[str] = set()


class Child:
    """How one release's processes run: its python, a clean environment, its time limits, forked
    from the release's zygote (:mod:`harness.zygote`) unless ``own_process``."""

    def __init__(self, release: VllmRelease, rerun: str):
        self.release = release
        self.rerun = rerun

    def run(self, args: list, env: dict, cwd: Path = ROOT, own_process: bool = False) -> limits.Finished:
        env = {**env, "VLLM_CACHE_ROOT": str(self.release.vllm_cache)}
        return limits.run([str(self.release.python), *map(str, args)], env=env, cwd=cwd, rerun=self.rerun,
                          zygote=None if own_process else zygote_of(self.release))


_zygotes: dict[str, Zygote] = {}
_zygote_lock = threading.Lock()


def zygote_of(release: VllmRelease) -> Zygote:
    """The release's zygote, started by the first process that needs it (it ends with this pytest
    process: its stdin closes). It starts with the environment every job shares (no PYTHONPATH,
    nothing of dsv4sel's or vLLM's own variables): what its preloaded libraries read at import."""
    with _zygote_lock:
        if release.version not in _zygotes:
            env = {k: v for k, v in os.environ.items()
                   if k not in (*USER_ENV, "PYTHONPATH") and not k.startswith(("DSV4SEL_", "VLLM_"))}
            _zygotes[release.version] = Zygote(str(release.python), preload_env(env), VLLM_PRELOAD)
        return _zygotes[release.version]


def rerun_command(release: VllmRelease, module: str) -> str:
    """The command that reruns one test file of ``release`` alone."""
    return f"python -m pytest -q -p no:xdist {release.folder.relative_to(ROOT)}/{module}.py"


def clean_env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in USER_ENV and not k.startswith("DSV4SEL_TEST_")}
    env.update(PYTHONPATH=str(ROOT), DSV4SEL_CACHE_DIR=str(cache), NO_COLOR="1")
    env.update(extra)
    return env


# ------------------------------------------------------------------ the differential
def _differential(child: Child, out: Path, cache: Path, warm: Future, platform: str, model: str | None) -> dict:
    warm.result()
    path = out / f"{platform}-{model or 'all'}.json"
    compat = child.release.compat
    rules = ["--rules", f"compat={compat}"] if compat.is_dir() else []
    proc = child.run([SCRIPTS / "differential.py", platform, *(["--model", model] if model else []), *rules,
                      "--out", path], clean_env(cache))
    assert proc.returncode == 0, f"{platform}: differential run failed:\n{proc.stderr[-4000:]}"
    return json.loads(path.read_text())


def _warm_cache(child: Child, cache: Path) -> None:
    """Compile the rule sets the differential reads into its cache, once (each of its processes
    would otherwise compile the compat set itself)."""
    code = "import sys, dsv4sel; dsv4sel.default_rules(); [dsv4sel.load_rules(paths=[p]) for p in sys.argv[1:]]"
    compat = child.release.compat
    proc = child.run(["-c", code, *([compat] if compat.is_dir() else [])], clean_env(cache))
    assert proc.returncode == 0, proc.stderr[-3000:]


# ------------------------------------------------------------------ the host check
def _hostcheck(child: Child, out: Path) -> dict:
    """``dsv4sel check``'s host check on a ROCm platform object, for the shipped rules and for the
    shipped rules plus a pack naming a class vLLM does not have."""
    pack = RULES / "nosuch"  # X_DSV4 names vllm.models.deepseek_v4.nvidia.flashmla:NoSuchAttention
    proc = child.run([SCRIPTS / "hostcheck.py", "rocm", "--rules", pack], clean_env(out / "cache"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ the plugin scenarios
def _models(child: Child, out: Path) -> tuple[Path, Path, Path]:
    """Tiny Hugging Face configs (no weights), a DeepSeek-V4 and a Llama model written in one
    process, and the pack: ``(models, pack rules, pack source)``."""
    models = out / "models"
    proc = child.run([SCRIPTS / "plugin_scenarios.py", "model", models / "v4", "DeepseekV4ForCausalLM",
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


#: a scenario's script by name: the plugin scenarios, vLLM's own CLI, torch's compiler configuration
SCENARIO_SCRIPTS = {"plugin": "plugin_scenarios.py", "serve": "serve.py", "compiler": "compiler_config.py"}


def scenario(child: Child, directory: Path, args: list, platform: str | None = "cuda", capability: str = "9.0",
             script="plugin", own_process: bool = False, **env: str) -> tuple[int, list[str], list[dict], str]:
    """One scenario process (:data:`SCENARIO_SCRIPTS`), forked from the release's zygote unless
    ``own_process``: (exit status, its dsv4sel log lines, its JSON result lines, stderr). vLLM's own
    CLI is forked too: the engine core process it starts is a fresh interpreter either way
    (multiprocessing's spawn, which imports serve.py, and so its stubs, again)."""
    extra = dict(env)
    if platform:
        extra.update(DSV4SEL_TEST_PLATFORM=platform, DSV4SEL_TEST_CAPABILITY=capability)
    file = SCRIPTS / SCENARIO_SCRIPTS[script]
    proc = child.run([file, *args], clean_env(directory / "cache", **extra), cwd=directory,
                     own_process=own_process)
    text = proc.stdout + proc.stderr
    lines = [line for line in text.splitlines() if "dsv4sel" in line and "== config" not in line]
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, lines, out, proc.stderr


def _scenarios(child: Child, out: Path, models: Future) -> dict[str, tuple]:
    """The jobs of the plugin scenarios, by name: ``(args, keywords for scenario())``."""
    m, rules, src = models.result()
    pack_env = {"DSV4SEL_RULES_PATH": str(rules), "PYTHONPATH": f"{ROOT}{os.pathsep}{src}"}
    other = child.release.other_version
    return {
        # four engine configurations in one process (vLLM loads the plugins once per process)
        "configs": (["config", m / "v4", "+", m / "v4", "--kv-cache-dtype", "bfloat16", "+",
                     m / "v4", "--attention-backend", "CUTLASS_MSA", "+", m / "llama"], {}),
        "no-platform": (["load"], {"platform": None}),
        "no-platform-asked": (["load"], {"platform": None, "VLLM_PLUGINS": "dsv4sel"}),
        "version": (["load"], {"DSV4SEL_TEST_FAKE_VERSION": other}),
        "version-asked": (["load"], {"DSV4SEL_TEST_FAKE_VERSION": other, "VLLM_PLUGINS": "dsv4sel"}),
        "pack": (["config", m / "v4"], pack_env),
        "pack-allowed": (["config", m / "v4"], {**pack_env, "DSV4SEL_ALLOW_IMPL_MODULES": "demo_dsv4_kernels"}),
        # the role under disaggregation, as vLLM's own KVTransferConfig answers it, decides for a pack that reads it
        "pd-roles": (["config", m / "v4", "+", m / "v4", "--kv-transfer-config", KV_CONSUMER, "+", m / "v4",
                      "--kv-transfer-config", KV_BOTH],
                     {"capability": "10.0", "DSV4SEL_RULES_PATH": str(PD_ROLES_PACK)}),
        # vLLM's own `vllm serve` (SM90 stubbed): its start-up and decision lines, docs/vllm.md
        "serve": (["serve", m / "v4", "--max-model-len", "1024", "--load-format", "dummy", "--skip-tokenizer-init"],
                  {"script": "serve"}),
        # torch's compiler configured alike in a forked child and in a plain process (harness/zygote.py)
        "compiler-forked": ([], {"script": "compiler"}),
        "compiler-plain": ([], {"script": "compiler", "own_process": True}),
    }


KV_CONSUMER = '{"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}'
KV_BOTH = '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'


def _one_scenario(child: Child, out: Path, models: Future, name: str) -> tuple:
    args, kw = _scenarios(child, out, models)[name]
    directory = out / name
    directory.mkdir()
    return scenario(child, directory, args, **kw)


SCENARIOS = ("serve", "configs", "no-platform", "no-platform-asked", "version", "version-asked", "pack",
             "pack-allowed", "pd-roles", "compiler-plain", "compiler-forked")
#: a pack that decides by the process's role under disaggregation (tests/dsv4/test_roles.py)
PD_ROLES_PACK = ROOT / "tests" / "packs" / "pd_roles" / "rules"


# ------------------------------------------------------------------ the pack layer (issue 33)
#: the example pack, and the packs of the pack-layer cases (their own code under packs/)
B12X_PACK = ROOT / "examples" / "b12x-pack"
PACKS = SCRIPTS.parent / "packs"


def _pack_layer(child: Child, out: Path) -> dict[str, dict]:
    """``harness/pack_layer.py`` in one process: its JSON lines by case."""
    models = out / "models"
    proc = child.run([SCRIPTS / "plugin_scenarios.py", "model", models / "v4", "DeepseekV4ForCausalLM",
                      models / "llama", "LlamaForCausalLM"], clean_env(out / "cache"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rules = [B12X_PACK / "dsv4sel_b12x" / "rules", RULES / "torchref", RULES / "ownlayer"]
    env = clean_env(out / "cache", DSV4SEL_RULES_PATH=os.pathsep.join(map(str, rules)),
                    DSV4SEL_ALLOW_IMPL_MODULES="dsv4sel_b12x,ownlayer_pack",
                    PYTHONPATH=os.pathsep.join(map(str, (ROOT, B12X_PACK, PACKS))))
    proc = child.run([SCRIPTS / "pack_layer.py", models / "v4", models / "llama"], env, cwd=out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {d["case"]: d for d in (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))}


# ------------------------------------------------------------------ pip's resolver
def _install(child: Child, out: Path) -> dict:
    proc = child.run([SCRIPTS / "extra_resolve.py", ROOT, out / "standins"], clean_env(out / "cache"), cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ starting and waiting
def start(request, tmp_path_factory) -> None:
    """Launch the processes the vLLM test files need: in one pytest process, every collected file's
    for every release, at once (once per session). Under pytest-xdist each worker collects every
    file but runs only those it is handed (``--dist loadfile``: whole files), so a worker launches
    only the requesting file's processes, once: no process runs twice."""
    module = request.module.__name__
    if os.environ.get("PYTEST_XDIST_WORKER"):
        if module not in _launched:
            _launched.add(module)
            launch({module}, tmp_path_factory.mktemp("vllm"))
    elif not _launched:
        _launched.add("*")
        launch({getattr(item.module, "__name__", "") for item in request.session.items},
               tmp_path_factory.mktemp("vllm"))


def launch(collected: set[str], root: Path) -> None:
    """Launch the processes of the release test files named in ``collected`` (module names such as
    ``v0_34.test_differential``), under ``root``; a release whose environment is missing is left out."""
    # pytest-xdist workers share the machine: each takes its part of the bound
    workers = max(2, WORKERS // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    pool = ThreadPoolExecutor(max_workers=workers)
    _pool.append(pool)
    wanted: dict[str, set[str]] = {}
    for name in sorted(collected):
        package, _, module = name.rpartition(".")
        if module in (DIFFERENTIAL, PLUGIN, INSTALL, PACK_LAYER) and package.startswith("v"):
            wanted.setdefault(package, set()).add(module)
    releases = [(of_package(package), modules) for package, modules in sorted(wanted.items())]
    releases = [(r, m) for r, m in releases if r.skip_reason() is None]
    # longest first, across releases: the differentials, then the plugin scenarios, the rest
    for release, modules in releases:
        if DIFFERENTIAL in modules:
            _launch_differential(pool, release, root / release.version)
    for release, modules in releases:
        if PLUGIN in modules:
            child = Child(release, rerun_command(release, PLUGIN))
            out = root / release.version / "plugin"
            out.mkdir(parents=True)
            models = pool.submit(_models, child, out)
            for name in SCENARIOS:
                _jobs[(release.version, f"scenario:{name}")] = pool.submit(_one_scenario, child, out, models, name)
    for release, modules in releases:
        if DIFFERENTIAL in modules:
            child = Child(release, rerun_command(release, DIFFERENTIAL))
            (root / release.version / "hostcheck").mkdir(parents=True)
            _jobs[(release.version, "hostcheck")] = pool.submit(_hostcheck, child, root / release.version / "hostcheck")
        if PACK_LAYER in modules:
            child = Child(release, rerun_command(release, PACK_LAYER))
            (root / release.version / "pack_layer").mkdir(parents=True)
            _jobs[(release.version, "pack_layer")] = pool.submit(_pack_layer, child,
                                                                root / release.version / "pack_layer")
        if INSTALL in modules:
            child = Child(release, rerun_command(release, INSTALL))
            (root / release.version / "install").mkdir(parents=True)
            _jobs[(release.version, "install")] = pool.submit(_install, child, root / release.version / "install")


def _launch_differential(pool: ThreadPoolExecutor, release: VllmRelease, root: Path) -> None:
    child = Child(release, rerun_command(release, DIFFERENTIAL))
    out = root / "differential"
    out.mkdir(parents=True)
    warm = pool.submit(_warm_cache, child, out / "cache")
    for platform, model in RUNS:
        _jobs[(release.version, f"differential:{platform}:{model}")] = pool.submit(
            _differential, child, out, out / "cache", warm, platform, model)


def result(release: VllmRelease, name: str):
    return _jobs[(release.version, name)].result()
