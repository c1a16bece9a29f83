# Two commands on a fresh machine: `make repro` (installs when needed, then runs the pipeline: dvc repro) and
# `make test`. `make install` alone sets up .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install repro queue kernels test test-cuda lint gpu-wheels deps lock

# Every package is installed at the version requirements.lock names (made by `make lock` from pyproject.toml's direct
# pins and constraints.txt), so an install gives the same environment on any day.
# torch is pinned through constraints.txt to the local CPU build (an unpinned torch pulls CUDA wheels);
# torchvision's CUDA build is made importable by pipeline/compat/torchvision_cpu.py (a lazy .pth hook).
# uv installs the same pins as pip in ~30 s instead of ~75 s; where uv cannot be had, pip does it. Bytecode is
# compiled at install: with PYTHONDONTWRITEBYTECODE set, every stage would otherwise compile torch again (~6 s).
FIND_LINKS := $(shell $(PY) -m pip config get global.find-links 2>/dev/null)
LOCK := requirements.lock
UV_PIP = $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python $(if $(FIND_LINKS),--find-links $(FIND_LINKS))
install:
	$(PY) -m venv $(VENV)
	if $(BIN)/pip install -q uv==0.13.9; then \
	  $(UV_PIP) -c $(LOCK) torch torchvision --no-deps && \
	  $(UV_PIP) -c $(LOCK) -e ".[dev]"; \
	else \
	  $(BIN)/pip install -q -c $(LOCK) torch torchvision --no-deps && \
	  $(BIN)/pip install -q -c $(LOCK) -e ".[dev]"; \
	fi
	$(BIN)/python -m pipeline.compat.torchvision_cpu --install
	$(BIN)/python -c "import timm, torch, zarr, h5py, dvc, typer, pandas; print('environment ok: torch', torch.__version__, 'timm', timm.__version__)"

# dvc with the environment on PATH (the stages also find .venv by themselves: stages/run)
repro: $(BIN)/fscil
	PATH="$(CURDIR)/$(BIN):$$PATH" DVC_NO_ANALYTICS=1 $(BIN)/dvc repro
	@echo "metrics: metrics.json (per-session table: data/report/sessions.csv)"

# the experiments queued with `dvc exp run --queue`, J at a time (`make queue J=2`): DVC's queue workers call `dvc`
# by name, so the environment's bin goes on their PATH (a bare `.venv/bin/dvc queue start` leaves them Queued). With
# J > 1 the CPU threads wait passively: J runs of `threads` each can exceed the cores, and spinning OpenMP threads
# then take 2x longer than the same runs one after the other (measured on 2 cores); the numbers are the same.
J ?= 1
queue: $(BIN)/fscil
	PATH="$(CURDIR)/$(BIN):$$PATH" DVC_NO_ANALYTICS=1 $(if $(filter-out 1,$(J)),OMP_WAIT_POLICY=PASSIVE) \
	  $(BIN)/dvc queue start -j $(J)
	@echo "running in the background: dvc queue status; dvc queue logs NAME --follow; then dvc exp show"

# a changed dependency list (pyproject.toml, constraints.txt, the lock) installs again
$(BIN)/fscil: pyproject.toml constraints.txt $(LOCK)
	$(MAKE) install
	touch $@

# the kernel tests need triton (~1 GB): installed for the tests, not for `make repro`
kernels: $(BIN)/fscil
	$(BIN)/python -c "import triton" 2>/dev/null || \
	  if [ -x $(BIN)/uv ]; then $(UV_PIP) -c $(LOCK) -e ".[dev,kernels]"; \
	  else $(BIN)/pip install -q -c $(LOCK) -e ".[dev,kernels]"; fi

# the tests in TEST_JOBS parallel workers (pytest-xdist; `make test TEST_JOBS=1` runs them in one process), each
# test handed to the next free worker
TEST_JOBS ?= auto
test: kernels
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -x -n $(TEST_JOBS) --dist worksteal --durations=15

# on a CUDA machine: the same suite with the stage tests on the GPU, and the kernel tests when mamba-ssm imports
test-cuda: kernels
	FSCIL_TEST_DEVICE=cuda $(BIN)/python -m pytest -q --durations=15

lint:
	$(BIN)/ruff check .

# dvc.yaml's code deps and params from each stage's imports, and docs/keys.md from the key declarations
deps: $(BIN)/fscil
	$(BIN)/python -m stages.dvc_deps
	$(BIN)/fscil config keys --out docs/keys.md

# what a lent GPU machine lacks (its image has no zarr and no package registry), as wheels for its Python 3.12:
# carried to it in .ci/wheels (git-ignored) for .ci/gpu-paper-scale
gpu-wheels: $(BIN)/fscil
	$(BIN)/pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
	  --platform manylinux2014_x86_64 -d .ci/wheels "zarr==$$($(BIN)/python -c 'import zarr; print(zarr.__version__)')"

# requirements.lock again from pyproject.toml (a direct dependency's pin changed) and constraints.txt: every package
# under them resolved to one version for this Python; commit the result (README "Install and run")
lock:
	test -x $(BIN)/uv || { $(PY) -m venv $(VENV) && $(BIN)/pip install -q uv==0.13.9; }
	$(BIN)/uv pip compile -q pyproject.toml --extra dev --extra kernels -c constraints.txt \
	  $(if $(FIND_LINKS),--find-links $(FIND_LINKS)) --python $(BIN)/python --no-header -o $(LOCK)
	sed -i '1i # Every package at one version: made by `make lock` from pyproject.toml and constraints.txt (README).' $(LOCK)
