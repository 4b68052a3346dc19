# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Pinned: an unpinned torch makes pip fetch a multi-GB CUDA build.
TORCH  := torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: run test check bench docs clean

# Setup is quiet (pip -qq keeps errors, drops the mirror's notices) so that
# the output of `make run` starts with the main job.
$(STAMP): pyproject.toml setup.py
	@echo "setting up $(VENV) (first run only)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -qq --upgrade pip
	@$(BIN)/python -m pip install -qq $(TORCH)
	@$(BIN)/python -m pip install -qq -e '.[test]'
	@touch $@

run: $(STAMP)
	$(BIN)/dsv4sel check
	$(BIN)/dsv4sel explain --platform cuda --capability 9.0 --kv-cache-dtype auto

test: $(STAMP)
	$(BIN)/dsv4sel check
	$(BIN)/dsv4sel test tests/decisions
	$(BIN)/dsv4sel test examples/b12x-pack/tests --rules examples/b12x-pack/dsv4sel_b12x/rules --allow-impl-module dsv4sel_b12x
	$(BIN)/dsv4sel table --format md --check docs/backends.md
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

docs: $(STAMP)
	$(BIN)/dsv4sel table --format md > docs/backends.md

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
