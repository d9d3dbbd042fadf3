# keras-dist: `make demo` and `make test` are all a fresh machine needs.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
KERAS_MIN := 3.10.0
KERAS_MIN_DIR := .venv-keras-min
PYTEST := $(PY) -m pytest -q -rs
export TF_CPP_MIN_LOG_LEVEL ?= 3

.PHONY: install demo test test-jax test-tensorflow test-keras-min test-stress bench clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements/constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c requirements/constraints.txt -e ".[jax,tensorflow-cpu,test]"
	touch $@

demo: install
	KERAS_BACKEND=jax $(PY) examples/digits_cnn.py

# Each backend runs in its own pytest process (the backend is fixed per
# process); both always run, and the target fails if either failed.
test: install
	@status=0; \
	$(MAKE) --no-print-directory test-jax || status=1; \
	$(MAKE) --no-print-directory test-tensorflow || status=1; \
	$(MAKE) --no-print-directory test-keras-min || status=1; \
	exit $$status

test-jax: install
	KERAS_BACKEND=jax $(PYTEST) tests

test-tensorflow: install
	KERAS_BACKEND=tensorflow $(PYTEST) tests

# Same answer every time: the examples repeated under CPU load, every run's
# weights hashed (slow; CI runs it after `make test`).
test-stress: install
	@status=0; for backend in jax tensorflow; do \
	  KERAS_BACKEND=$$backend $(PYTEST) tests/test_stress.py -m stress || status=1; \
	done; exit $$status

# The oldest supported Keras, overlaid on the same environment.
test-keras-min: install
	test -d $(KERAS_MIN_DIR)/keras || $(PY) -m pip install -q --no-deps --target $(KERAS_MIN_DIR) keras==$(KERAS_MIN)
	@status=0; for backend in jax tensorflow; do \
	  PYTHONPATH=$(KERAS_MIN_DIR) KERAS_BACKEND=$$backend KERAS_DIST_EXPECT_KERAS=$(KERAS_MIN) \
	    $(PYTEST) tests/test_keras_version.py tests/test_hooks.py tests/test_architecture.py \
	      "tests/test_equivalence.py" -k "not test_equivalence or (partial and adam) or on_batch" || status=1; \
	done; exit $$status

bench: install
	$(PY) benchmarks/run.py
	$(PY) benchmarks/weak_scaling.py

clean:
	rm -rf $(VENV) $(KERAS_MIN_DIR) build *.egg-info
