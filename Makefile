# make demo: the whole workflow on the built-in tiny study (CPU, no network), ending with
#            results/tiny/grpo_equivalence.md
# make report [STUDY=FILE]: Snakemake's HTML report of a study that has run (the tiny study by default), in its
#            results folder
# make test: the test suite (what CI runs), TEST_JOBS modules at a time
# make test-fast: the tests that run no whole workflow (the edit loop)
# make test-quick: unit tests and one small workflow, under 2 minutes (before each commit)
# make docs: docs/configuration.md from the study's schema (a test fails when it is out of date)
# Each target creates .venv and installs what it needs on first use.

VENV ?= .venv
PY := $(VENV)/bin/python
CORES ?= 2
STUDY ?= studies/tiny.yaml
# Three modules at a time on two cores: the tests wait on SLURM's queue, on signals and on jobs starting up, and a
# third module fills the cores meanwhile (docs/development.md has the timings).
TEST_JOBS ?= 3
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# Python keeps what it compiles at import (.pyc), once: every job imports torch, transformers and TRL anew and would
# compile them again, seconds a job, where the machine sets PYTHONDONTWRITEBYTECODE. pip installs with --no-compile:
# it would compile every file on one core, most of them never imported.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: demo report test test-fast test-quick docs lint clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	# The CPU build of torch first, from PyTorch's CPU index as envs/cpu.yaml takes it (a plain `torch`
	# requirement would pull a multi-GB CUDA build); an offline machine takes the same file from its own
	# wheel folder (find-links). TRL 1.16, whose GRPO trainer runs without Triton, i.e. on a CPU.
	$(PY) -m pip install -q --no-compile --retries 1 --timeout 10 --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
	$(PY) -m pip install -q --no-compile -e ".[test]" "trl==1.16.*" "transformers==5.17.0"
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/snakemake --cores $(CORES) --config study=studies/tiny.yaml
	@echo "report: results/tiny/grpo_equivalence.md"

# The study's results folder, as the workflow names it (`results`, else results/NAME)
report: $(VENV)/.installed
	@folder=$$($(PY) -m grpo_equivalence.study.config results-folder $(STUDY)) && \
	$(VENV)/bin/snakemake --report "$$folder/report.html" --config study=$(STUDY) && echo "report: $$folder/report.html"

# Every run of the tests is a cold one, as on a new machine and in CI: the caches it fills (torch.compile's and
# Triton's kernels, Hugging Face's and matplotlib's) live in a folder of the clone, emptied first, never in the
# user's or the machine's (a warm cache there made a fresh machine's first run twice as long as the docs said).
TEST_CACHE := $(CURDIR)/.test-cache
TESTS_COLD = rm -rf $(TEST_CACHE) && mkdir -p $(TEST_CACHE) && \
	XDG_CACHE_HOME=$(TEST_CACHE) HF_HOME=$(TEST_CACHE)/huggingface MPLCONFIGDIR=$(TEST_CACHE)/matplotlib \
	TORCHINDUCTOR_CACHE_DIR=$(TEST_CACHE)/inductor TRITON_CACHE_DIR=$(TEST_CACHE)/triton
# A module's tests stay on one worker (--dist loadfile): its whole-workflow fixture is built once; modules
# start in tests/conftest.py's order, the longest first (--no-loadscope-reorder).
PYTEST = $(VENV)/bin/pytest -ra -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test: $(VENV)/.installed
	$(TESTS_COLD) $(PYTEST)

test-fast: $(VENV)/.installed
	$(TESTS_COLD) $(PYTEST) -m "not workflow"

test-quick: $(VENV)/.installed
	$(TESTS_COLD) $(PYTEST) -m "quick or not (workflow or slow or cuda)"

docs: $(VENV)/.installed
	$(PY) -m grpo_equivalence.study.reference docs/configuration.md

lint: $(VENV)/.installed
	$(VENV)/bin/snakemake --lint --config study=studies/tiny.yaml

clean:
	rm -rf results .snakemake
