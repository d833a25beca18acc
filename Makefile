# Two commands do all the set-up on a fresh machine (Debian/Ubuntu, Python 3.10+):
#   make demo   install, run the instrumented demo RL run into runs/demo, print its report
#   make test   install everything the tests need (Chromium included), run every test
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install install-dev browser demo test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# a stamp: a second `make demo` reuses the venv instead of asking pip again (pyproject.toml changed: it reinstalls)
INSTALLED := $(VENV)/.rltrace-installed

install: $(INSTALLED)

$(INSTALLED): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q torch==2.13.0  # the CPU build; a bare `torch` may pull a multi-GB CUDA build
	$(BIN)/python -m pip install -q -e '.[all]'
	touch $@

install-dev: install
	$(BIN)/python -m pip install -q -e '.[all,dev]'
	# verl's own pins would replace the transformers TRL needs: its timer and trainer modules import with these
	$(BIN)/python -m pip install -q --no-deps 'verl==0.9.1'
	$(BIN)/python -m pip install -q torch==2.13.0 codetiming 'tensordict>=0.10,<0.11' omegaconf torchdata peft

browser:  # Debian's Chromium for the dashboard's end-to-end test (Playwright cannot download one here), Java for Spark's
	@command -v chromium >/dev/null 2>&1 || ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium)
	@command -v java >/dev/null 2>&1 || ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q default-jre-headless)

demo: install
	$(BIN)/python -m examples.tiny_grpo --out runs/demo --overwrite
	$(BIN)/rltrace info runs/demo
	$(BIN)/rltrace report runs/demo
	@echo "Next: $(BIN)/rltrace ui runs/demo   (the dashboard; docs/demo.md lists the fault flags to try)"

JOBS ?= 2  # pytest workers: the suite takes about 14 minutes on 2 cores this way (goal: under 10)

test: install-dev browser
	$(BIN)/python -m pytest -n $(JOBS) --dist loadfile
