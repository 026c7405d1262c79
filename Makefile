# Entry points for a fresh clone: `make demo` (set up, then run the bundled default profile
# offline on CPU), `make test` (set up, then run the whole test suite) and `make demo-head`
# (train the demo target's EAGLE head, offline, at most an hour on 2 cores; resumable).
PYTHON ?= python3
VENV ?= .venv
# CPU torch by default: an unpinned torch pulls a multi-GB CUDA build. For a GPU, set
# TORCH="torch==2.13.0 --index-url <your CUDA wheel index>" or preinstall torch in the venv.
TORCH ?= torch==2.13.0
PROMPT ?= write quicksort in python
BIN := $(VENV)/bin

.PHONY: demo demo-head test setup clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e ".[demo,quant,test]"
	touch $@

demo: setup
	$(BIN)/specgen run "$(PROMPT)"

demo-head: setup
	$(BIN)/specgen heads train --profile qwen-coder-demo-eagle

# pytest exits 5 when it collected no tests: that must fail loudly, never pass.
test: setup
	@HF_HUB_OFFLINE=1 $(BIN)/python -m pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "ERROR: pytest ran no tests (exit 5)" >&2; fi; exit $$rc

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
