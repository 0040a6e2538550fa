# dgx-stage: set-up, demo and tests. `make demo` and `make test` are the two entry points;
# `make help` lists the rest. Run from the repo root (ansible.cfg is picked up from here).
# `make setup` and `make demo` work for an ordinary user: no root, no system packages (only python3-venv
# when the interpreter lacks ensurepip). The test targets install the system packages only the tests
# need (Podman, mmdebstrap, rsync...: scripts/setup-system.sh test), as root.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
# The test steps must run one after the other, and in the listed order, even under -j.
.NOTPARALLEL:
MAKEFLAGS += --no-builtin-rules

PYTHON ?= python3
VENV := $(CURDIR)/.venv
CACHE := $(CURDIR)/.cache
BASE_IMAGE := dgx-stage-base:bookworm

# Re-install the Python deps only when requirements.txt changes: the stamp name carries its hash.
REQ_HASH := $(shell sha256sum requirements.txt 2>/dev/null | cut -c1-16)
REQ_STAMP := $(VENV)/.requirements-$(REQ_HASH).stamp
# The front end (dgx_stage/, `.venv/bin/dgx-stage`) is installed in editable mode, again only when
# pyproject.toml changes, or the venv last pointed it at another work tree (a clone
# sharing a venv must not run the other tree's playbooks): the package's code is read from the repo.
PKG_HASH := $(shell (cat pyproject.toml; echo "$(CURDIR)") 2>/dev/null | sha256sum | cut -c1-16)
PKG_STAMP := $(VENV)/.dgx-stage-$(PKG_HASH).stamp
# The collections requirements.yml pins, unpacked from this release of the `ansible` package's wheel (the whole
# package is ~36,000 files to write and compile; scripts/install-collections.py checks each version).
ANSIBLE_BUNDLE := 12.3.0
COLL_HASH := $(shell (cat requirements.yml scripts/install-collections.py; echo "$(ANSIBLE_BUNDLE)") 2>/dev/null | sha256sum | cut -c1-16)
COLL_STAMP := $(VENV)/.collections-$(COLL_HASH).stamp

# Environment for every recipe (scripts and tools see the same set-up as CI).
export PATH := $(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export CONTAINERS_CONF := $(CURDIR)/molecule/containers.conf
export PYTHONDONTWRITEBYTECODE := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# Molecule's podman playbooks write under $HOME; keep that and Ansible's temp dirs disposable.
# Molecule also replaces ANSIBLE_CONFIG with its own generated ansible.cfg, so the repo's
# library/, module_utils/ and roles/ paths are passed again as environment variables.
MOLECULE_ENV := HOME=$(CACHE)/home \
	ANSIBLE_REMOTE_TMP=$(CACHE)/ansible/remote-tmp \
	ANSIBLE_LOCAL_TEMP=$(CACHE)/ansible/local-tmp \
	ANSIBLE_LIBRARY=$(CURDIR)/library \
	ANSIBLE_MODULE_UTILS=$(CURDIR)/module_utils \
	ANSIBLE_ROLES_PATH=$(CURDIR)/roles
# The scenarios `make molecule` runs, side by side (each has containers of its own: molecule/base.yml);
# `make molecule MOLECULE_SCENARIOS=faults` runs one.
MOLECULE_SCENARIOS ?= dgx_2x faults
COMMA := ,

# $(call pytest,DIR): run pytest on DIR; "no tests collected" (exit 5) is not a failure.
define pytest
rc=0; $(VENV)/bin/pytest -q $(1) || rc=$$?; \
if [[ $$rc -eq 5 ]]; then echo "no tests collected in $(1)"; rc=0; fi; \
exit $$rc
endef

.PHONY: help setup system-packages demo demo-4x test check lint unit integration molecule molecule-scenario bench image clean \
	leftovers-snapshot leftovers-check

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(firstword $(MAKEFILE_LIST)) | \
		awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

setup: $(REQ_STAMP) $(COLL_STAMP) $(PKG_STAMP) ## venv, Python deps, the collections requirements.yml pins, .venv/bin/dgx-stage (quick when done)

$(VENV)/bin/python:
	@PYTHON=$(PYTHON) scripts/setup-system.sh venv
	$(PYTHON) -m venv $(VENV)

$(REQ_STAMP): | $(VENV)/bin/python
	$(VENV)/bin/pip install --quiet --requirement requirements.txt
	rm -f $(VENV)/.requirements-*.stamp
	echo "$(REQ_HASH)" > $@

$(COLL_STAMP): $(REQ_STAMP)
	$(VENV)/bin/python scripts/install-collections.py $(ANSIBLE_BUNDLE) requirements.yml $(CACHE)/wheels
	rm -f $(VENV)/.collections-*.stamp
	echo "$(COLL_HASH)" > $@

$(PKG_STAMP): $(REQ_STAMP)
	$(VENV)/bin/pip install --quiet --no-deps --no-build-isolation --no-index --editable .
	rm -f $(VENV)/.dgx-stage-*.stamp
	echo "$(PKG_HASH)" > $@

system-packages: ## the system packages only the tests need (Podman, mmdebstrap, rsync...), as root
	@scripts/setup-system.sh test

demo: setup ## build a synthetic NAS hub and stage it on localhost (an ordinary user will do: no root)
	$(VENV)/bin/python scripts/demo.py

# The SGLang lane of four nodes as four local-connection hosts (inventory/demo-4x, under .cache/demo-4x): rank
# templates, two NAS readers at once, fan-out host to host (rsync). No root, like `make demo`.
demo-4x: setup ## four local hosts stage the engram layout: rank templates, 2 NAS readers, fan-out (no root; rsync)
	$(VENV)/bin/python scripts/demo.py --4x

# Nothing the tests start may outlive them. Every step of `make test` gets a run id in its environment, which each
# process the tests start inherits whatever session it moves to: at the end, tests/leftovers.py names every process
# still carrying it (a dockerd too), and every mount and container not in the snapshot taken before the first
# step, and fails the run.
LEFTOVERS := $(CACHE)/leftovers.json

test: export DGX_STAGE_TEST_RUN := $(shell od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
test: leftovers-snapshot setup system-packages check integration molecule leftovers-check ## everything CI runs: lint beside unit, integration, Molecule; then fails if anything they started is left

leftovers-snapshot:
	@$(PYTHON) tests/leftovers.py snapshot $(LEFTOVERS)

leftovers-check:
	@$(PYTHON) tests/leftovers.py check $(LEFTOVERS)

lint: setup ## yamllint + ansible-lint (production profile, offline)
	$(VENV)/bin/yamllint -s .
	$(VENV)/bin/ansible-lint

# Test processes side by side: unit tests one per core, spread one by one; integration files whole (each file, or
# group of files, on one worker, the longest first: tests/integration/conftest.py), one worker more than the two
# cores, since two leave a core idle about a seventh of the time while Ansible and the engines wait.
UNIT_WORKERS ?= 2
INTEGRATION_WORKERS ?= 3

unit: setup ## unit tests (tests/unit)
	@$(call pytest,-n $(UNIT_WORKERS) tests/unit)

# Lint and the unit tests side by side (ansible-lint keeps about one core busy): lint's output is shown after the
# tests', and either failing fails the target.
check: setup ## the fast loop, before every commit: lint and unit tests side by side (about a minute)
	@+MAKE='$(MAKE)' scripts/side-by-side.sh lint unit UNIT_WORKERS=1

# A Docker engine for the docker-runtime tests: scripts/docker-daemon.sh starts dockerd when none answers
# (log and pid file in .cache/docker/) and stops only the daemon it started, when the command ends.
DOCKER_RUN := scripts/docker-daemon.sh run --

# The engine double image is built (or found up to date by the hash of its inputs) once, before the workers start.
# Each module payload is built, and each module source compiled, once per run (tests/module_build_cache/sitecustomize.py),
# in a cache directory of the installed Python deps (a new requirements.txt starts a new one).
integration: setup system-packages image ## integration tests (tests/integration; a Docker daemon for the run; the 25 slowest listed)
	@mkdir -p -m 0755 $(CACHE)/module-build/$(REQ_HASH)
	@$(VENV)/bin/python -m py_compile tests/module_build_cache/sitecustomize.py   # read by every process of the run
	@$(DOCKER_RUN) env PYTHONPATH=$(CURDIR)/tests/module_build_cache MODULE_BUILD_CACHE=$(CACHE)/module-build/$(REQ_HASH) \
	bash -c 'BASE_IMAGE=$(BASE_IMAGE) bash tests/engine_double/build.sh && \
	$(call pytest,-n $(INTEGRATION_WORKERS) --durations=25 tests/integration)'

# The NAS is built once, then the scenarios run side by side (Molecule's steps wait on Podman much of the time):
# the first one's output live, the other's after it. They get the engine's receipt root names
# (dgx_receipts.RECEIPT_ROOTS) as DGX_RECEIPT_ROOTS.
molecule: setup system-packages image ## Molecule scenarios side by side (Podman, nodes as containers): dgx_2x, faults
	mkdir -p $(CACHE)/home $(CACHE)/ansible
	$(VENV)/bin/python molecule/shared/nas_hub.py build $(CACHE)/molecule/nas
	@set -- $(MOLECULE_SCENARIOS); [ $$# -gt 0 ] || { echo "make molecule: MOLECULE_SCENARIOS is empty: name one of molecule/*/ at least"; exit 2; }; \
	first=$$1; shift; \
	if [ $$# -eq 0 ]; then $(MAKE) --no-print-directory molecule-scenario SCENARIO=$$first; \
	else rest=$$(echo $$* | tr ' ' ,); \
	MAKE='$(MAKE)' scripts/side-by-side.sh "molecule-scenario SCENARIO=$$rest" molecule-scenario SCENARIO=$$first; fi

# SCENARIO=a,b: these scenarios one after another, on the NAS `make molecule` built; each runs even when one
# before it failed, and the failed ones are named at the end.
molecule-scenario:
	@[ -n "$(SCENARIO)" ] || { echo "make molecule-scenario: set SCENARIO=name[,name...] (molecule/*/), or run make molecule"; exit 2; }
	roots=$$($(VENV)/bin/python -c 'import dgx_stage; dgx_stage.use_module_utils(); \
	from ansible.module_utils.dgx_receipts import RECEIPT_ROOTS; print(",".join(RECEIPT_ROOTS))'); failed=; \
	for scenario in $(subst $(COMMA), ,$(SCENARIO)); do \
	$(MOLECULE_ENV) DGX_RECEIPT_ROOTS="$$roots" $(VENV)/bin/molecule --base-config molecule/base.yml test -s $$scenario \
	|| failed="$$failed $$scenario"; done; \
	[ -z "$$failed" ] || { echo "molecule: failed:$$failed"; exit 1; }

bench: setup ## module vs cp/rsync/sha256sum, table + .cache/bench/latest.json (BENCH_ROUNDS, BENCH_WORKERS, BENCH_CASES)
	@scripts/setup-system.sh bench   # rsync, the warm re-run's baseline (the bench runs without it if missing)
	$(VENV)/bin/python scripts/bench.py

image: system-packages ## Podman base image for Molecule (dgx-stage-base:bookworm), built once
	@BASE_IMAGE=$(BASE_IMAGE) scripts/build-base-image.sh

# The demo keeps its NAS copy read-only by permissions when not run as root: give the write bits back first.
clean: ## remove reports/ and .cache/ (keeps .venv/)
	if [[ -d $(CACHE) ]]; then chmod -R u+w $(CACHE) 2>/dev/null || true; fi
	rm -rf reports/ $(CACHE)/
