# keras-dist: `make demo` and `make test` are all a fresh machine needs.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Single-backend installs, as a user gets them from `pip install ".[jax]"` or
# `".[tensorflow-cpu]"`: the other backend's package is absent.
VENV_JAX := .venv-jax
VENV_TF := .venv-tensorflow
KERAS_MIN := 3.10.0
KERAS_MIN_DIR := .venv-keras-min
PYTEST := $(PY) -m pytest -q -rs
export TF_CPP_MIN_LOG_LEVEL ?= 3

.PHONY: install install-jax install-tensorflow demo test test-chain-jax test-chain-tensorflow \
	test-jax test-jax-with-tensorflow test-tensorflow test-keras-min test-keras-min-jax \
	test-keras-min-tensorflow test-stress test-faults bench clean

comma := ,
# $(call make-venv,DIR,EXTRAS): DIR holds `pip install -e ".[EXTRAS]"`, pinned.
define make-venv
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q -c requirements/constraints.txt -e ".[$(2)]"
endef

install: $(STAMP)

$(STAMP): pyproject.toml requirements/constraints.txt
	$(call make-venv,$(VENV),jax$(comma)tensorflow-cpu$(comma)ray$(comma)test)
	touch $@

install-jax: $(VENV_JAX)/.installed

$(VENV_JAX)/.installed: pyproject.toml requirements/constraints.txt
	$(call make-venv,$(VENV_JAX),jax$(comma)ray$(comma)test)
	@! $(VENV_JAX)/bin/python -c "import tensorflow" 2>/dev/null || \
	  { echo "$(VENV_JAX) has tensorflow: not a JAX-only install" >&2; exit 1; }
	touch $@

install-tensorflow: $(VENV_TF)/.installed

$(VENV_TF)/.installed: pyproject.toml requirements/constraints.txt
	$(call make-venv,$(VENV_TF),tensorflow-cpu$(comma)test)
	@! $(VENV_TF)/bin/python -c "import jax" 2>/dev/null || \
	  { echo "$(VENV_TF) has jax: not a TensorFlow-only install" >&2; exit 1; }
	touch $@

demo: install
	KERAS_BACKEND=jax $(PY) examples/digits_cnn.py

# Each backend runs in its own pytest processes (the backend is fixed per
# process), in a venv with only that backend, as `pip install ".[jax]"` or
# `".[tensorflow]"` gives it. The two backends' chains run side by side (two
# cores: about 40 min instead of 60 one after the other), each into its own
# log, printed when both are done; every part always runs, and the target
# fails if any failed.
TEST_LOGS := .test-logs

test: install install-jax install-tensorflow $(KERAS_MIN_DIR)/.installed
	@rm -rf $(TEST_LOGS); mkdir -p $(TEST_LOGS); \
	$(MAKE) --no-print-directory -k test-chain-jax > $(TEST_LOGS)/jax.log 2>&1 & jax=$$!; \
	$(MAKE) --no-print-directory -k test-chain-tensorflow > $(TEST_LOGS)/tensorflow.log 2>&1 & tf=$$!; \
	status=0; wait $$jax || status=1; wait $$tf || status=1; \
	echo "===== JAX ($(TEST_LOGS)/jax.log)"; cat $(TEST_LOGS)/jax.log; \
	echo "===== TensorFlow ($(TEST_LOGS)/tensorflow.log)"; cat $(TEST_LOGS)/tensorflow.log; \
	exit $$status

test-chain-jax: test-jax test-jax-with-tensorflow test-keras-min-jax
test-chain-tensorflow: test-tensorflow test-keras-min-tensorflow

# KERAS_DIST_SINGLE_BACKEND: tests/test_single_backend_install.py checks the
# other backend's package is absent. Tests marked needs_tensorflow (tf.data
# input or TensorBoard on JAX) are skipped here, naming the next target.
test-jax: install-jax
	KERAS_BACKEND=jax KERAS_DIST_SINGLE_BACKEND=jax $(VENV_JAX)/bin/python -m pytest -q -rs --durations=15 --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-jax tests

# Just the needs_tensorflow tests on JAX, where both backends are installed.
test-jax-with-tensorflow: install
	KERAS_BACKEND=jax $(PYTEST) --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-jax-tf --only-other-backend-tests tests

test-tensorflow: install-tensorflow
	KERAS_BACKEND=tensorflow KERAS_DIST_SINGLE_BACKEND=tensorflow $(VENV_TF)/bin/python -m pytest -q -rs --durations=15 --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-tensorflow tests

# Same answer every time: the examples repeated under CPU load, every run's
# weights hashed (slow; CI runs it after `make test`).
test-stress: install
	@status=0; for backend in jax tensorflow; do \
	  KERAS_BACKEND=$$backend $(PYTEST) tests/test_stress.py -m stress || status=1; \
	done; exit $$status

# No hang the timeout misses: a worker stopped or killed at each phase of a
# job (slow; CI runs it after `make test`).
test-faults: install
	@status=0; for backend in jax tensorflow; do \
	  KERAS_BACKEND=$$backend $(PYTEST) tests/test_fault_phases.py -m faults || status=1; \
	done; exit $$status

# The oldest supported Keras, overlaid on the same environment.
$(KERAS_MIN_DIR)/.installed: $(STAMP)
	test -d $(KERAS_MIN_DIR)/keras || $(PY) -m pip install -q --no-deps --target $(KERAS_MIN_DIR) keras==$(KERAS_MIN)
	touch $@

test-keras-min: test-keras-min-jax test-keras-min-tensorflow

# (Two explicit targets: make skips pattern rules for .PHONY targets.)
KERAS_MIN_TESTS = PYTHONPATH=$(KERAS_MIN_DIR) KERAS_BACKEND=$(1) KERAS_DIST_EXPECT_KERAS=$(KERAS_MIN) \
	  $(PYTEST) --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-keras-min-$(1) \
	    tests/test_keras_version.py tests/test_hooks.py tests/test_architecture.py \
	    "tests/test_equivalence.py" -k "not test_equivalence or (partial and adam) or on_batch"

test-keras-min-jax: install $(KERAS_MIN_DIR)/.installed
	$(call KERAS_MIN_TESTS,jax)

test-keras-min-tensorflow: install $(KERAS_MIN_DIR)/.installed
	$(call KERAS_MIN_TESTS,tensorflow)

bench: install
	$(PY) benchmarks/run.py
	$(PY) benchmarks/weak_scaling.py
	$(PY) benchmarks/per_worker_input.py
	$(PY) benchmarks/parameter_server.py

clean:
	rm -rf $(VENV) $(VENV_JAX) $(VENV_TF) $(KERAS_MIN_DIR) $(TEST_LOGS) build *.egg-info
