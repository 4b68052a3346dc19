# Two commands on a fresh machine: `make run` and `make test`. `make docs` regenerates every
# generated doc: docs/backends.md, every compat rule set and vLLM fix-cube doc, and the samples and
# counts in README.md and docs/ (tools/doc_samples.py; `make test` fails when one is stale).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Pinned: an unpinned torch makes pip fetch a multi-GB CUDA build.
TORCH  := torch==2.13.0
STAMP  := $(VENV)/.installed
# The differential suite's vLLM environments, one per release the host registry lists (CPU torch,
# vLLM --no-deps), each built once: .venv-vllm (0.33.0), .venv-vllm-0.34, ... (tools/vllm_env.py).
VLLM_VENVS := .venv-vllm $(wildcard .venv-vllm-*[0-9])
# The SGLang differential suite's 0.5.23 environment (CPU torch, SGLang --no-deps); built once.
SGLANG_VENV  := .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.dsv4sel-sglang-env

.PHONY: run test check bench docs clean vllm-env sglang-env

# Setup says what it is doing, one line per step, and nothing else (pip -qq keeps errors,
# drops the mirror's notices), so that the output of `make run` is the main job.
$(STAMP): pyproject.toml setup.py
	@echo "setting up $(VENV) (first run only)"
	@test -x $(BIN)/python || { echo "  creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "  upgrading pip"
	@$(BIN)/python -m pip install -qq --upgrade pip
	@echo "  installing $(TORCH) (pinned: an unpinned torch would pull a multi-GB CUDA build)"
	@$(BIN)/python -m pip install -qq $(TORCH)
	@echo "  installing dsv4sel (editable) and its test tools"
	@$(BIN)/python -m pip install -qq -e '.[test]'
	@touch $@

# The shipped rules' compiled form, as the wheel's build hook writes it (setup.py);
# rebuilt whenever a rule file or an engine module changes.
ARTIFACT := dsv4sel/shipped.dsv4c
$(ARTIFACT): $(STAMP) $(shell find rules dsv4sel/engine dsv4sel/dsv4/profile.py dsv4sel/schema -name '*.yaml' -o -name '*.py' -o -name '*.json' 2>/dev/null)
	@echo "compiling the shipped rules ($(ARTIFACT))"
	@$(BIN)/python -c "import dsv4sel.api as a; a.write_shipped_artifact()" > /dev/null

# The main job first: one explain, then the rules' check in one line (`dsv4sel check` alone
# prints the coverage tables too).
run: $(STAMP) $(ARTIFACT)
	$(BIN)/dsv4sel explain --platform cuda --capability 9.0 --kv-cache-dtype auto
	$(BIN)/dsv4sel check --summary

# Builds each release's environment on first use (measured ~8 min each on the busy 2-core machine),
# one after the other. Each build prints one line per step; pip's output goes to FOLDER.log. A failed
# build is one warning line and the others go on: that release's tests skip, naming the log.
vllm-env: $(STAMP)
	@$(BIN)/python tools/vllm_env.py --all

# Builds .venv-sglang on first use (measured ~6 min on the 2-core machine); a failed build is logged
# and the SGLang tests skip.
sglang-env: $(STAMP)
	@test -f $(SGLANG_STAMP) || $(BIN)/python tools/sglang_env.py --venv $(SGLANG_VENV) > .venv-sglang.log 2>&1 \
		|| echo "warning: building $(SGLANG_VENV) failed (see .venv-sglang.log); the SGLang 0.5.23 tests will skip"

# pytest runs one worker per core (pytest-xdist); --dist loadfile keeps each test file, and so
# each differential suite's module-scoped run of vLLM or SGLang, on one worker.
# mypy with no arguments checks the packages [tool.mypy] names: dsv4sel and kernels/ as
# dsv4sel.kernels (through typecheck/); ruff's rule set is stated in [tool.ruff.lint].
test: $(STAMP) $(ARTIFACT) vllm-env sglang-env
	@# the checkout's own bytecode, as pip writes it for an installed package (plain and -O, the SGLang
	@# suite runs -O processes): where PYTHONDONTWRITEBYTECODE is set, as on the 2-core test machine,
	@# each of the suite's hundreds of processes would otherwise compile dsv4sel from source
	@$(BIN)/python -m compileall -q -j 0 -o 0 -o 1 dsv4sel kernels tests tools > /dev/null
	$(BIN)/mypy
	$(BIN)/ruff check .
	$(BIN)/dsv4sel check
	$(BIN)/dsv4sel test tests/decisions
	$(BIN)/dsv4sel test examples/b12x-pack/tests --rules examples/b12x-pack/dsv4sel_b12x/rules --allow-impl-module dsv4sel_b12x
	$(BIN)/dsv4sel table --format md --check docs/backends.md
	$(BIN)/python tools/doc_samples.py --check
	$(BIN)/python -m pytest -q -n auto --dist loadfile

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

docs: $(STAMP)
	$(BIN)/dsv4sel table --format md > docs/backends.md
	$(BIN)/python tools/gen_compat.py --all
	$(BIN)/python tools/vllm_fix_cubes.py --all
	$(BIN)/python tools/doc_samples.py --write

clean:
	rm -rf $(VENV) $(VLLM_VENVS) $(VLLM_VENVS:=.log) $(SGLANG_VENV) .venv-sglang.log build *.egg-info .pytest_cache .hypothesis \
		.mypy_cache .ruff_cache
