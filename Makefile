# Two commands a newcomer needs: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROMPT ?= def fibonacci(n):

.PHONY: run test test-docs lint install install-test clean

# the native kernels (edge0/kernels) are compiled by the install: rebuild when they change
KERNEL_SRC := $(wildcard edge0/kernels/src/*) edge0/kernels/CMakeLists.txt setup.py

$(BIN)/edge0: pyproject.toml $(KERNEL_SRC)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $(BIN)/edge0

install: $(BIN)/edge0

# the test extra's packages alone (installing '.[test]' would compile the kernels again)
$(VENV)/.test-installed: $(BIN)/edge0 pyproject.toml
	$(BIN)/python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['test'], sep='\n')" > $(VENV)/test-requirements.txt
	$(BIN)/pip install -q -r $(VENV)/test-requirements.txt
	touch $@

install-test: $(VENV)/.test-installed

run: install
	$(BIN)/edge0 run -p "$(PROMPT)" --temp 0.7 --top-p 0.95 --seed 0 --max-tokens 96

# the unit and integration tests; the examples and documented commands are `test-docs`
test: install-test
	$(BIN)/python -m pytest -q -m "not docs" --durations=10

test-docs: install-test
	$(BIN)/python -m pytest -q -rs -m docs --durations=10

lint: install-test
	$(BIN)/ruff check edge0 tiers tools tests examples docs/benchmarks/scripts
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info edge0/kernels/_native*.so
