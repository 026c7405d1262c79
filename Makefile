# Entry points for a fresh clone: `make demo` (set up, then run the bundled default profile
# offline on CPU), `make test` (set up, then run the whole test suite) and `make demo-head`
# (train the demo target's EAGLE head, offline, at most an hour on 2 cores; resumable).
# Setup installs the exact versions in requirements/lock.txt; `make lock` writes it again from
# pyproject.toml's ranges, and `make test-latest` runs the suite on the newest releases those
# ranges allow, to meet a breaking release before a user does.
PYTHON ?= python3
VENV ?= .venv
LATEST_VENV ?= .venv-latest
LOCK := requirements/lock.txt
# CPU torch by default (requirements/torch.txt): an unpinned torch pulls a multi-GB CUDA
# build. For a GPU, set TORCH="torch==2.13.0 --index-url <your CUDA wheel index>".
TORCH ?= -r requirements/torch.txt
PIP := pip==26.3 "setuptools>=68"
PIP_TOOLS := pip-tools==7.6.2
EXTRAS := demo,quant,test
PROMPT ?= write quicksort in python
BIN := $(VENV)/bin

.PHONY: demo demo-head test test-latest setup lock clean llamacpp

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(LOCK) requirements/torch.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(PIP)
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -r $(LOCK)
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

demo: setup
	$(BIN)/specgen run "$(PROMPT)"

demo-head: setup
	$(BIN)/specgen heads train --profile qwen-coder-demo-eagle

# llama.cpp's own tools (llama-speculative-simple, llama-simple, llama-bench) built natively from
# the llama.cpp source of the llama-cpp-python sdist pinned in requirements/llama.txt, into
# specgen's cache (<cache>/llama.cpp/<version>/bin and lib), and llama-cpp-python installed
# against that library: `specgen bench`'s llamacpp and llamacpp-spec contestants. About 11
# minutes on 2 cores; needs cmake and a C++17 compiler.
llamacpp: setup
	PYTHON=$(BIN)/python scripts/build_llamacpp.sh

# pytest exits 5 when it collected no tests: that must fail loudly, never pass.
define pytest
	@HF_HUB_OFFLINE=1 $(1)/python -m pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "ERROR: pytest ran no tests (exit 5)" >&2; fi; exit $$rc
endef

test: setup
	$(call pytest,$(BIN))

# Every range in pyproject.toml resolved again to exact versions, for this Python and
# requirements/torch.txt's torch (torch and triton themselves stay out: TORCH installs them).
lock: setup
	$(BIN)/python -m pip install -q $(PIP_TOOLS)
	$(BIN)/pip-compile -q --upgrade --extra=$(subst $(comma),$(space)--extra=,$(EXTRAS)) \
	  --unsafe-package=torch --unsafe-package=triton --unsafe-package=setuptools \
	  --unsafe-package=pip --no-emit-index-url --no-emit-find-links --strip-extras \
	  --output-file=$(LOCK) pyproject.toml requirements/torch.txt

# Not part of CI: a venv of its own with the newest releases pyproject.toml allows (torch
# still from TORCH), then the whole suite.
test-latest:
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install -q $(PIP)
	$(LATEST_VENV)/bin/python -m pip install -q $(TORCH)
	$(LATEST_VENV)/bin/python -m pip freeze | grep -iE '^(torch|triton)==' > $(LATEST_VENV)/torch.txt
	$(LATEST_VENV)/bin/python -m pip install -q --upgrade --upgrade-strategy eager \
	  -c $(LATEST_VENV)/torch.txt -e ".[$(EXTRAS)]"
	$(LATEST_VENV)/bin/python -m pip list --format=freeze > $(LATEST_VENV)/versions.txt
	$(call pytest,$(LATEST_VENV)/bin)

clean:
	rm -rf $(VENV) $(LATEST_VENV) build *.egg-info src/*.egg-info .pytest_cache

comma := ,
space := $(empty) $(empty)
