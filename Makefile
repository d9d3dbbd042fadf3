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
VENV_TORCH := .venv-torch
KERAS_MIN := 3.10.0
KERAS_MIN_DIR := .venv-keras-min
# The next Keras, as `pip install keras-nightly` gives it (pinned: the build
# this release was tested on; take a newer one on as the README says).
KERAS_NIGHTLY := 3.16.0.dev2026102704
KERAS_NIGHTLY_DIR := .venv-keras-nightly
PYTEST := $(PY) -m pytest -q -rs
export TF_CPP_MIN_LOG_LEVEL ?= 3

.PHONY: test-extended test-ray install install-jax install-tensorflow demo test test-tensorflow-in-process test-tensorflow-with-orbax test-tensorflow-in-process-late \
	test-tensorflow-processes \
	test-quick durations test-jax test-jax-in-process test-jax-processes test-jax-with-tensorflow test-tensorflow \
	test-tensorflow-processes-late test-keras-min test-keras-min-jax \
	test-keras-nightly test-keras-nightly-jax test-keras-nightly-tensorflow test-keras-nightly-torch \
	test-keras-min-tensorflow test-stress test-faults test-zoo test-bench bench clean \
	test-zoo-jax test-zoo-jax-dnn test-zoo-tensorflow test-zoo-tensorflow-application test-zoo-jax-tutorials \
	test-zoo-tensorflow-tutorials test-zoo-tensorflow-ctl test-zoo-tensorflow-correctness install-torch test-torch test-keras-min-torch \
	test-zoo-sample docs

comma := ,
# $(call make-venv,DIR,EXTRAS): DIR holds `pip install -e ".[EXTRAS]"`, pinned.
# Then the project's own sources are byte-compiled: pip compiles what it
# installs, but keras_dist is installed editable, and where
# PYTHONDONTWRITEBYTECODE is set (as on this project's machines) every process
# would compile keras_dist again (measured: 0.2 CPU-s a process; `make test`
# starts hundreds). A stale .pyc is never used: Python checks the source's
# time stamp and size.
define make-venv
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q -c requirements/constraints.txt -e ".[$(2)]"
	$(1)/bin/python -m compileall -q keras_dist tests examples benchmarks
endef

install: $(STAMP)

# The both-backends venv is the union of the two single-backend ones (pinned
# alike by requirements/constraints.txt, so `pip install ".[jax,tensorflow-cpu,
# ray,test]"` would install exactly their packages): a .pth file adds their
# site-packages (requirements/union_venv.py, which refuses venvs that
# disagree on a version), after keras_dist is installed editable (before:
# pip's isolated build would see the venvs' old setuptools), and `pip check`
# checks the union. Measured: a third full install cost 87 s and ~90 CPU-s
# at the start of `make test`, beside the other two; this costs a few.
$(STAMP): $(VENV_JAX)/.installed $(VENV_TF)/.installed
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	rm -f $(VENV)/lib/python*/site-packages/keras_dist_union.pth
	$(VENV)/bin/python -m pip install -q --no-deps -e .
	$(PYTHON) requirements/union_venv.py $(VENV) $(VENV_JAX) $(VENV_TF)
	$(VENV)/bin/python -m pip check
	touch $@

install-jax: $(VENV_JAX)/.installed

$(VENV_JAX)/.installed: pyproject.toml requirements/constraints.txt
	$(call make-venv,$(VENV_JAX),jax$(comma)ray$(comma)orbax$(comma)test)
	@! $(VENV_JAX)/bin/python -c "import tensorflow" 2>/dev/null || \
	  { echo "$(VENV_JAX) has tensorflow: not a JAX-only install" >&2; exit 1; }
	touch $@

install-torch: $(VENV_TORCH)/.installed

# The torch backend alone (`pip install ".[torch]"`: no jax, no tensorflow).
$(VENV_TORCH)/.installed: pyproject.toml requirements/constraints.txt
	$(call make-venv,$(VENV_TORCH),torch$(comma)test)
	@! $(VENV_TORCH)/bin/python -c "import tensorflow" 2>/dev/null || \
	  { echo "$(VENV_TORCH) has tensorflow: not a torch-only install" >&2; exit 1; }
	@! $(VENV_TORCH)/bin/python -c "import jax" 2>/dev/null || \
	  { echo "$(VENV_TORCH) has jax: not a torch-only install" >&2; exit 1; }
	touch $@

install-tensorflow: $(VENV_TF)/.installed

$(VENV_TF)/.installed: pyproject.toml requirements/constraints.txt
	$(call make-venv,$(VENV_TF),tensorflow-cpu$(comma)test)
	@! $(VENV_TF)/bin/python -c "import jax" 2>/dev/null || \
	  { echo "$(VENV_TF) has jax: not a TensorFlow-only install" >&2; exit 1; }
	touch $@

# A JAX demo in a JAX-only install (.venv-jax): with TensorFlow installed
# too, Keras' set_random_seed imports it, and TF prints notices at import
# that no setting turns off.
demo: install-jax
	KERAS_BACKEND=jax $(VENV_JAX)/bin/python examples/digits_cnn.py

# Each backend runs in its own pytest processes (the backend is fixed per
# process), in a venv with only that backend, as `pip install ".[jax]"` or
# `".[tensorflow]"` gives it. The venvs are built first (the two
# single-backend ones side by side, then their union: .test-logs/venvs.log).
# Then the suite runs as TEST_PARTS, one pytest run each, five at a time
# (tests/run_parts.py): longest first, each part starting as soon as a slot
# is free, so the slots end together
# whatever the parts' lengths become (a fixed list per stream cannot follow
# them: in the last fixed layout one stream ended 220 s after another).
# Each part writes its own log, printed when all are done; every part runs,
# and the target fails if any failed.
#   test-jax-processes:   JAX's tests that start processes (.venv-jax)
#   test-tensorflow-processes, -processes-late: TensorFlow's that do, but
#                         for / then TF_PROCESSES_LATE (.venv-tensorflow)
#   test-tensorflow-in-process, -in-process-late: TensorFlow's that start
#                         none, but for / then TF_IN_PROCESS_LATE
#   test-jax-in-process:  JAX's that start none (.venv-jax)
#   test-jax-with-tensorflow: JAX's needs_tensorflow tests (.venv)
#   test-tensorflow-with-orbax: TensorFlow's needs_orbax tests (.venv)
#   test-torch:           the torch backend's tests (.venv-torch)
# Every pytest run writes what each test cost to .test-logs/durations/;
# `make durations` turns them into tests/DURATIONS.md.
TEST_LOGS := .test-logs
TEST_PARTS := test-tensorflow-in-process test-jax-processes test-tensorflow-processes test-jax-in-process \
	test-tensorflow-in-process-late test-jax-with-tensorflow test-tensorflow-processes-late test-torch \
	test-tensorflow-with-orbax
TEST_SLOTS := 5
#: Every part but the first (TensorFlow's in-process tests, one pytest
#: process) runs this much nicer: Linux shares the two cores per thread, and
#: the other parts' workers outnumbered it (in one run it had 6.5 CPU-min in
#: 21 min, and ended last).
TEST_NICE := 5
DURATIONS_FILE = KERAS_DIST_DURATIONS=$(CURDIR)/$(TEST_LOGS)/durations/$(1).json
#: The JAX pytest processes of a part share one XLA compilation cache, new
#: each run, one per part (the parts run at once, and JAX writes those
#: cache entries unlocked); the JAX processes the tests start (examples,
#: workers) share one more, locked (tests/conftest.py says what each does
#: and does not skip; measured: 9% less CPU for the JAX tests that start
#: processes). test-stress uses one of its own (see there), test-faults none.
#: $(call JAX_TEST_CACHE,NAME[,PROCESS-CACHE-NAME]): the second names the
#: processes' cache where a target keeps its own (default: processes).
JAX_TEST_CACHE = KERAS_DIST_TEST_JAX_CACHE=$(CURDIR)/$(TEST_LOGS)/jax-cache-$(1) \
	KERAS_DIST_TEST_JAX_PROCESS_CACHE=$(CURDIR)/$(TEST_LOGS)/jax-cache-$(or $(2),processes)
#: The JAX suites of `make test`, `make test-quick` and `make test-zoo` (and
#: the processes their tests start) have XLA's CPU backend hand its code to LLVM at -O0:
#: most of a test's JAX time is compiling tiny models, and -O0 compiles
#: them faster (measured: test_equivalence 136 -> 91 CPU-s; test_multi_worker
#: + test_docs + test_hooks 252 -> 207; with the cache above, the zoo's
#: optimizer zoo and save/load and datasets ports 205 -> 99). XLA's own passes (sharding,
#: collectives, fusion) are unchanged, so keras_dist's programs are the same;
#: only the machine code is less optimised, and its round-off may differ in
#: the last bits, the same for the distributed and the one-device run a test
#: compares. XLA's defaults stay tested: the oldest-Keras runs of the hooks
#: and equivalence tests, test-stress (bitwise hashes), test-faults, `make
#: demo` and the benchmarks compile at -O2.
JAX_TEST_COMPILE = XLA_FLAGS="--xla_backend_optimization_level=0 $$XLA_FLAGS"
#: `make test` and `make test-quick` put tests/startup on PYTHONPATH, so
#: their processes and every process their tests start run its
#: sitecustomize.py: Keras' own eager imports of scikit-learn (and scipy)
#: and matplotlib, which only the test extra installs, are refused, as in a
#: user's `pip install ".[jax]"` (measured: `import keras, keras_dist` 5.2 ->
#: 3.4 CPU-s on TensorFlow, 3.0 -> 1.5 on JAX; a 2-worker TF test 37 -> 30).
#: Anything else importing them (the examples' digits data, ScalingReport's
#: plot) gets them as usual. The other targets and `make demo` run without
#: it, as users' machines with those packages do.
#: The same sitecustomize.py turns TensorFlow's graph optimizer (grappler)
#: off where KERAS_DIST_TEST_TF_GRAPPLER=off, as set here: it rewrites every
#: tf.function each time one is instantiated, and the tests instantiate
#: thousands of tiny ones (measured side by side, twice: TensorFlow's
#: test_equivalence and test_custom_loops 134 -> 125 CPU-s, -7%; a 2-worker
#: job 67 -> 65). As with
#: JAX's -O0 above, each test compares two runs in the same setting, and
#: TensorFlow's defaults stay tested by the targets that run without this
#: folder: test-keras-min, -zoo, -bench, -faults, -stress and `make demo`.
TEST_STARTUP = PYTHONPATH=$(CURDIR)/tests/startup$${PYTHONPATH:+:$$PYTHONPATH} KERAS_DIST_TEST_TF_GRAPPLER=off
test:
	@rm -rf $(TEST_LOGS); mkdir -p $(TEST_LOGS)/durations; start=$$SECONDS; \
	{ $(MAKE) --no-print-directory -j2 install-jax install-tensorflow install-torch && \
	  $(MAKE) --no-print-directory install $(KERAS_NIGHTLY_DIR)/.installed; } > $(TEST_LOGS)/venvs.log 2>&1 || \
	  { cat $(TEST_LOGS)/venvs.log; echo "== venvs failed after $$((SECONDS - start)) s"; exit 1; }; \
	echo "== venvs ready after $$((SECONDS - start)) s"; \
	$(PYTHON) tests/run_parts.py --jobs $(TEST_SLOTS) --nice $(TEST_NICE) --logs $(TEST_LOGS) $(TEST_PARTS); status=$$?; \
	echo "== make test: $$((SECONDS - start)) s (venvs included), exit $$status"; \
	exit $$status

# The inner loop (about 5 min): the tests that start no process (no
# subprocess, no multi-process job, no Ray), on one backend (JAX unless
# KERAS_BACKEND says otherwise); a test that starts one anyway fails, naming
# the `starts_processes` marker it needs.
# It runs in the backend's own venv, as `make test` does.
QUICK_BACKEND := $(or $(KERAS_BACKEND),jax)
QUICK_VENV := $(if $(filter tensorflow,$(QUICK_BACKEND)),$(VENV_TF),$(VENV_JAX))
test-quick: $(QUICK_VENV)/.installed
	$(TEST_STARTUP) KERAS_BACKEND=$(QUICK_BACKEND) KERAS_DIST_TEST_JAX_CACHE=$(CURDIR)/$(TEST_LOGS)/jax-cache-quick $(JAX_TEST_COMPILE) \
	  $(QUICK_VENV)/bin/python -m pytest -q -rs --quick --durations=10 tests

# The API reference (docs/): HTML from keras_dist's docstrings into
# .docs-site/, by mkdocs + mkdocstrings in their own venv (.venv-docs,
# requirements/docs.txt, no backend: they read the sources). `--strict`: a
# warning (a docstring that does not parse, a broken link) fails the build.
# docs/gen_api.py writes the pages' list of names (tests/test_docs.py checks
# it is current); tests/test_docstring_examples.py runs the examples.
DOCS_VENV := .venv-docs
$(DOCS_VENV)/.installed: requirements/docs.txt
	test -x $(DOCS_VENV)/bin/python || $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install -q -r requirements/docs.txt
	touch $@

docs: $(DOCS_VENV)/.installed
	cd docs && ../$(DOCS_VENV)/bin/mkdocs build --strict
	@echo "API reference: .docs-site/index.html"

# The cost of every test, from the durations files of the last `make test`
# (runs it first if there are none).
durations:
	@ls $(TEST_LOGS)/durations/*.json >/dev/null 2>&1 || $(MAKE) --no-print-directory test
	$(PYTHON) tests/durations.py tests/DURATIONS.md $(TEST_LOGS)/durations/*.json

# KERAS_DIST_SINGLE_BACKEND: tests/test_single_backend_install.py checks the
# other backend's package is absent. Tests marked needs_tensorflow (tf.data
# input or TensorBoard on JAX) are skipped here, naming the next target.
JAX_TESTS = $(call DURATIONS_FILE,jax$(1)) $(call JAX_TEST_CACHE,jax$(1)) $(JAX_TEST_COMPILE) $(TEST_STARTUP) KERAS_BACKEND=jax \
	  KERAS_DIST_SINGLE_BACKEND=jax $(VENV_JAX)/bin/python -m pytest -q -rs --durations=15 \
	  --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-jax$(1) -m "not stress and not faults and not bench and not extended and not ray$(2)" \
	  --zoo-sample=sample tests

test-jax: test-jax-in-process test-jax-processes

test-jax-in-process: install-jax
	$(call JAX_TESTS,-in-process, and not starts_processes)

test-jax-processes: install-jax
	$(call JAX_TESTS,-processes, and starts_processes)

# Just the needs_tensorflow tests on JAX, where both backends are installed.
test-jax-with-tensorflow: install
	$(call DURATIONS_FILE,jax-with-tensorflow) $(call JAX_TEST_CACHE,mixed) $(JAX_TEST_COMPILE) $(TEST_STARTUP) KERAS_BACKEND=jax \
	  $(PYTEST) --durations=10 --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-jax-tf --only-other-backend-tests \
	  -m "not stress and not faults and not bench and not extended and not ray" --zoo-sample=sample tests

# Just the needs_orbax tests on TensorFlow (Keras' OrbaxCheckpoint:
# orbax-checkpoint brings jax, which the TensorFlow-only venv leaves out),
# in the union venv.
test-tensorflow-with-orbax: install
	$(call DURATIONS_FILE,tensorflow-with-orbax) $(TEST_STARTUP) KERAS_BACKEND=tensorflow \
	  $(PYTEST) --durations=5 --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-tensorflow-orbax --only-other-backend-tests \
	  -m "not stress and not faults and not bench and not extended and not ray" tests

# The TensorFlow suite is the longest, so `make test` runs it as four pytest
# processes: the tests that start no process and those that do, each in two
# parts, the second (TF_IN_PROCESS_LATE, TF_PROCESSES_LATE) at the end of
# `make test`'s parts (see TEST_PARTS above).
TF_IN_PROCESS_LATE := tests/test_hooks.py tests/test_cross_device_ops.py tests/test_inputs.py tests/test_gradients.py \
	tests/test_tpu_strategy.py
TF_PROCESSES_LATE := tests/test_docs.py
TF_TESTS = $(call DURATIONS_FILE,tensorflow-$(1)) $(TEST_STARTUP) KERAS_BACKEND=tensorflow KERAS_DIST_SINGLE_BACKEND=tensorflow \
	  $(VENV_TF)/bin/python -m pytest -q -rs --durations=15 --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-tensorflow-$(1) \
	  -m "not stress and not faults and not bench and not extended and not ray and $(2)" --zoo-sample=sample $(3)

test-tensorflow: test-tensorflow-in-process test-tensorflow-in-process-late test-tensorflow-processes \
	test-tensorflow-processes-late

test-tensorflow-in-process: install-tensorflow
	$(call TF_TESTS,in-process,not starts_processes,tests $(addprefix --ignore=,$(TF_IN_PROCESS_LATE)))

test-tensorflow-in-process-late: install-tensorflow
	$(call TF_TESTS,in-process-late,not starts_processes,$(TF_IN_PROCESS_LATE))

test-tensorflow-processes: install-tensorflow
	$(call TF_TESTS,processes,starts_processes,tests $(addprefix --ignore=,$(TF_PROCESSES_LATE)))

test-tensorflow-processes-late: install-tensorflow
	$(call TF_TESTS,processes-late,starts_processes,$(TF_PROCESSES_LATE))

# The torch backend's tests, in the torch-only venv: its own file (one
# replica per process, 2-worker gloo jobs), the cluster resolvers, and the
# shared multi-worker tests that hold for one replica per process (the others
# simulate several devices in a process, or read tf.data or tf checkpoints).
# The kill-and-resume jobs run in `make test-faults` (24 CPU-s beside its
# waits: `make test` has no room for them on 2 cores).
TORCH_TEST_FILES := tests/test_torch_backend.py tests/test_first_hour.py tests/test_bench_cli.py tests/test_keras_version.py tests/test_keras_distribution.py tests/test_hooks.py tests/test_architecture.py tests/test_cluster_resolver.py tests/test_porting_table.py \
	tests/test_multi_worker.py::test_bad_communication_options \
	tests/test_multi_worker.py::test_a_cluster_dict_for_a_resolver_names_simple_cluster_resolver \
	tests/test_multi_worker.py::test_example_through_the_launcher \
	tests/test_multi_worker.py::test_unseeded_workers_start_from_the_chiefs_weights \
	tests/test_multi_worker.py::test_an_address_this_process_cannot_serve_fails_before_joining \
	tests/test_multi_worker.py::test_a_worker_whose_peer_never_starts_exits_with_code_1 \
	tests/test_sigterm.py \
	tests/test_preemption.py::test_exported_from_experimental \
	tests/test_preemption.py::test_termination_config_checks_its_arguments \
	tests/test_preemption.py::test_sigterm_exits_42_before_the_next_step \
	tests/test_preemption.py::test_save_checkpoint_if_preempted_with_an_object_of_save_and_restore \
	tests/test_preemption.py::test_a_directory_checkpoint_moved_aside_is_still_found \
	tests/test_preemption.py::test_a_torn_write_leaves_the_previous_checkpoint \
	tests/test_preemption.py::test_bad_checkpoint_kinds_and_arguments \
	tests/test_preemption.py::test_a_save_that_writes_elsewhere_and_a_failing_watcher_are_errors \
	tests/test_preemption.py::test_save_fn_replaces_the_write \
	tests/test_preemption.py::test_values_from_every_worker_outside_a_job
test-torch: install-torch
	$(call DURATIONS_FILE,torch) $(TEST_STARTUP) KERAS_BACKEND=torch KERAS_DIST_SINGLE_BACKEND=torch \
	  $(VENV_TORCH)/bin/python -m pytest -q -rs --durations=15 --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-torch $(TORCH_TEST_FILES)

# $(call both-backends,NAME,PYTEST ARGUMENTS): one pytest run per backend,
# side by side, each into .test-logs/NAME-<backend>.log (and its durations
# record), both logs printed at the end; fails if either failed.
define both-backends
	@rm -rf $(TEST_LOGS)/$(1)-*.log $(TEST_LOGS)/durations/$(1)-*.json; mkdir -p $(TEST_LOGS)/durations; \
	for backend in jax tensorflow; do \
	  KERAS_DIST_DURATIONS=$(CURDIR)/$(TEST_LOGS)/durations/$(1)-$$backend.json KERAS_BACKEND=$$backend \
	    $(PYTEST) $(2) > $(TEST_LOGS)/$(1)-$$backend.log 2>&1 & \
	  eval "pid_$$backend=$$!"; \
	done; \
	status=0; wait $$pid_jax || status=1; wait $$pid_tensorflow || status=1; \
	for backend in jax tensorflow; do echo "===== test-$(1), $$backend"; cat $(TEST_LOGS)/$(1)-$$backend.log; done; \
	exit $$status
endef

# Same answer every time: the examples repeated under CPU load, every run's
# weights hashed (slow; CI runs it after `make test`). The runs go two at a
# time, each the other's load, and the two backends side by side (a load of
# 3-4 on 2 cores; see tests/test_stress.py). The JAX runs share one XLA
# compilation cache, new each time: the first two compile fresh, the rest
# load (tests/test_stress.py says why that tests the same thing).
test-stress: export KERAS_DIST_TEST_JAX_PROCESS_CACHE = $(CURDIR)/$(TEST_LOGS)/jax-cache-stress
test-stress: install install-torch
	@rm -rf $(TEST_LOGS)/jax-cache-stress
	$(call both-backends,stress,tests/test_stress.py -m stress)
	$(call DURATIONS_FILE,stress-torch) KERAS_BACKEND=torch $(VENV_TORCH)/bin/python -m pytest -q -rs -m stress \
	  tests/test_stress.py::test_multi_worker_example_is_bitwise_reproducible_under_load

# Real code nobody on the team wrote, too costly for `make test` (marker
# `zoo`): keras.applications' MobileNetV2 (tests/test_zoo.py, 155 layers)
# under OneDevice, Mirrored and CentralStorage against one device, and the
# tf-docs multi-worker tutorials as written (tests/test_tutorials.py: the
# 2-worker jobs of multi_worker_with_keras and _with_ctl, and the first's
# notebook sections; about a thousand steps of a 2.8M-parameter CNN each),
# and its input tutorial (a wait under make test's load: see its marker),
# and every optimizer Keras ships under those three strategies, built
# lazily and eagerly (tests/test_optimizer_zoo.py, about 1 CPU-min each),
# and tf-keras's ctl_correctness_test (TensorFlow, 129 cases, 2 CPU-min) and
# keras_save_load_test (91 cases per backend, 1.2 CPU-min) and four classes
# of distribute_strategy_test (93 + 61 cases per backend, 1.7 CPU-min) and
# keras_embedding_, keras_image_ and keras_rnn_model_correctness_test and
# keras_dnn_correctness_test's model classes (a rotation of their matrix,
# 91 cases per backend; tests/peer/README.md)
# ported, and two keras-hub backbones
# (tests/test_zoo_hub.py, from .venv-zoo below; 1 CPU-min per backend).
# Its JAX runs compile as `make test`'s do (-O0, a cache per run: see
# JAX_TEST_COMPILE); its TensorFlow runs use TensorFlow's defaults.
# CI runs it after `make test`, beside `make test-keras-min` (measured: the application about 4 CPU-min,
# mostly TensorFlow's tracing of every replica; the tutorials 3.8 CPU-min),
# as seven pytest runs, four at a time (tests/run_parts.py), TensorFlow's
# first: a TensorFlow run gets less of the two cores than a JAX one beside
# it (its tracer is one thread; XLA compiles on several). Per backend the
# tutorials (multi-worker jobs) run apart from the rest, and TensorFlow's
# application and ctl port apart too, so that what runs last is short (as
# three runs, 17 CPU-min took 608 s, and the run left alone at the end
# used one core; as five, three at a time, 608 s again: TensorFlow's
# optimizer zoo, ports and ctl port took 608 s for 4.4 CPU-min).
ZOO_FILES := tests/test_optimizer_zoo.py tests/peer/test_peer_keras_save_load.py \
	tests/peer/test_peer_distribute_strategy_keras_models.py tests/peer/test_peer_distribute_strategy_numpy.py \
	tests/peer/test_peer_distribute_strategy_datasets.py
#: TensorFlow runs these apart (test-zoo-tensorflow-correctness): in one run
#: with ZOO_FILES it was the last part to end, by 2 min, alone on a core.
ZOO_CORRECTNESS_FILES := tests/peer/test_peer_keras_embedding_correctness.py \
	tests/peer/test_peer_keras_image_correctness.py tests/peer/test_peer_keras_rnn_correctness.py \
	$(ZOO_DNN_MODELS) tests/test_zoo_hub.py
#: On JAX this file runs apart, compiled at XLA's defaults (test-zoo-jax-dnn),
#: the setting it was first green in. At -O0 3 of its functional cases miss
#: tf's 4e-5: the float32 runs part at a ReLU kink (their gap at round-off
#: for 297 steps, x20 in step 298), and the cases pass through
#: `_correctness_base`'s float64 fallback, which runs the strategy in float64
#: too (3.6e-15 from one device; tests/peer/README.md).
ZOO_DNN_MODELS := tests/peer/test_peer_keras_dnn_correctness_models.py
#: keras-hub (requirements/zoo.txt says why it is an overlay), for the
#: zoo's runs only.
ZOO_DIR := .venv-zoo
ZOO_STAMP := $(ZOO_DIR)/.installed
$(ZOO_STAMP): $(STAMP) requirements/zoo.txt
	rm -rf $(ZOO_DIR)
	$(PY) -m pip install -q --no-deps --target $(ZOO_DIR) -r requirements/zoo.txt
	touch $@
ZOO_TESTS = $(call DURATIONS_FILE,zoo-$(1)) PYTHONPATH=$(CURDIR)/$(ZOO_DIR) KERAS_BACKEND=$(2) $(PYTEST) --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-zoo-$(1) -m zoo --zoo-sample=rest $(3)
ZOO_PARTS := test-zoo-tensorflow-application test-zoo-tensorflow test-zoo-tensorflow-ctl test-zoo-jax test-zoo-jax-dnn \
	test-zoo-tensorflow-correctness \
	test-zoo-tensorflow-tutorials test-zoo-jax-tutorials

# The zoo's sample: each zoo file's `ZOO_SAMPLE` case (one multi-replica
# case of every tf-keras file ported to tests/peer: 9 on TensorFlow, 8 on
# JAX; MobileNetV2 under Mirrored(3) on JAX; the tf-docs multi-worker
# tutorial's job on TensorFlow; tests/_suite_plugin.py). `make test` runs
# it with the rest of its parts (--zoo-sample=sample), `make test-zoo`
# every other case (--zoo-sample=rest), so CI runs each case once. Alone,
# the peer files' sample is a 45 s check that each still runs. The
# optimizer zoo (about 1 CPU-min a case) and keras-hub (installed only for
# make test-zoo) set ZOO_SAMPLE = None and say why.
test-zoo-sample: install
	$(call DURATIONS_FILE,zoo-sample-jax) KERAS_BACKEND=jax $(PYTEST) --durations=5 --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-zoo-sample-jax \
	  -m zoo --zoo-sample=sample tests/peer && \
	$(call DURATIONS_FILE,zoo-sample-tensorflow) KERAS_BACKEND=tensorflow $(PYTEST) --durations=5 \
	  --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-zoo-sample-tensorflow -m zoo --zoo-sample=sample tests/peer

test-zoo: install $(ZOO_STAMP)
	@rm -rf $(TEST_LOGS)/test-zoo-*.log $(TEST_LOGS)/durations/zoo-*.json $(TEST_LOGS)/jax-cache-zoo-*; mkdir -p $(TEST_LOGS)/durations
	@$(PYTHON) tests/run_parts.py --jobs 4 --logs $(TEST_LOGS) $(ZOO_PARTS)

test-zoo-jax: install $(ZOO_STAMP)
	$(call JAX_TEST_CACHE,zoo-jax) $(JAX_TEST_COMPILE) $(call ZOO_TESTS,jax,jax,tests/test_zoo.py $(ZOO_FILES) \
	  $(filter-out $(ZOO_DNN_MODELS),$(ZOO_CORRECTNESS_FILES)))

test-zoo-jax-dnn: install $(ZOO_STAMP)
	$(call JAX_TEST_CACHE,zoo-jax-dnn) $(call ZOO_TESTS,jax-dnn,jax,$(ZOO_DNN_MODELS))

test-zoo-jax-tutorials: install $(ZOO_STAMP)
	$(call JAX_TEST_CACHE,zoo-jax-tutorials,zoo-processes) $(JAX_TEST_COMPILE) $(call ZOO_TESTS,jax-tutorials,jax,tests/test_tutorials.py)

test-zoo-tensorflow: install $(ZOO_STAMP)
	$(call ZOO_TESTS,tensorflow,tensorflow,$(ZOO_FILES))

test-zoo-tensorflow-correctness: install $(ZOO_STAMP)
	$(call ZOO_TESTS,tensorflow-correctness,tensorflow,$(ZOO_CORRECTNESS_FILES))

test-zoo-tensorflow-ctl: install $(ZOO_STAMP)
	$(call ZOO_TESTS,tensorflow-ctl,tensorflow,tests/peer/test_peer_ctl_correctness.py)

test-zoo-tensorflow-application: install $(ZOO_STAMP)
	$(call ZOO_TESTS,tensorflow-application,tensorflow,tests/test_zoo.py)

test-zoo-tensorflow-tutorials: install $(ZOO_STAMP)
	$(call ZOO_TESTS,tensorflow-tutorials,tensorflow,tests/test_tutorials.py)

# The benchmark scripts' quick runs (marker `bench`, tests/test_benchmarks.py:
# benchmarks/run.py's five configurations, weak scaling, per-worker input,
# TensorFlow's parameter servers), so `make bench` cannot rot; each starts
# the benchmark's own processes, 2.2 CPU-min in all, so CI runs them after
# `make test` instead of inside it. Both backends side by side.
test-bench: install install-torch
	$(call both-backends,bench,tests/test_benchmarks.py -m bench)
	$(call DURATIONS_FILE,bench-torch) KERAS_BACKEND=torch $(VENV_TORCH)/bin/python -m pytest -q -rs -m bench tests/test_torch_backend.py

# Second configurations of what `make test` runs (marker `extended`, which
# says why for each: another device or replica count, another checkpoint
# kind or signal, Adam where make test runs SGD on the same path, a
# cross-device op's variants, JAX's runs with tf.data or TensorBoard where
# make test runs JAX without and TensorFlow with them), in `make test`'s
# settings (JAX in the union venv, for its tf.data runs; TensorFlow and
# torch in their own); CI runs it after test-keras-min, beside test-zoo
# (measured: 5.0 CPU-min). Every backend runs, and the target fails if any
# failed.
test-extended: install install-torch
	@mkdir -p $(TEST_LOGS)/durations; status=0; \
	$(call DURATIONS_FILE,extended-jax) $(call JAX_TEST_CACHE,extended) $(JAX_TEST_COMPILE) $(TEST_STARTUP) KERAS_BACKEND=jax \
	  $(PY) -m pytest -q -rs --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-extended-jax -m extended tests || status=1; \
	$(call DURATIONS_FILE,extended-tensorflow) $(TEST_STARTUP) KERAS_BACKEND=tensorflow KERAS_DIST_SINGLE_BACKEND=tensorflow \
	  $(VENV_TF)/bin/python -m pytest -q -rs --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-extended-tensorflow -m extended tests || status=1; \
	$(call DURATIONS_FILE,extended-torch) $(TEST_STARTUP) KERAS_BACKEND=torch $(VENV_TORCH)/bin/python -m pytest -q -rs \
	  --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-extended-torch -m extended $(TORCH_TEST_FILES) || status=1; \
	exit $$status

# Ray's parameter-server suite beyond `make test`'s sample (marker `ray`,
# which says why for each): JAX's clusters of their own (an actor killed, a
# ps that stops answering, 2 workers x 2 ps with partitioned variables), a
# program's end, and the parameter-server tutorial's Ray cluster. `make
# test` keeps JAX's 1 worker x 1 ps cluster (step-for-step and fit against
# one device, custom loops, bad inputs, errors) and the launcher's example.
# Each Ray actor imports Keras and JAX, so on a 3x slower machine these took
# 20 min of make test's critical part; CI runs them beside the Keras range.
test-ray: install-jax
	@mkdir -p $(TEST_LOGS)/durations
	$(call DURATIONS_FILE,ray-jax) $(call JAX_TEST_CACHE,ray) $(JAX_TEST_COMPILE) $(TEST_STARTUP) KERAS_BACKEND=jax \
	  KERAS_DIST_SINGLE_BACKEND=jax $(VENV_JAX)/bin/python -m pytest -q -rs --durations=10 \
	  --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-ray-jax -m ray tests

# No hang the timeout misses: a worker stopped or killed at each phase of a
# job (slow; CI runs it after `make test`). Each job mostly waits out a
# timeout, so the two backends run side by side (the bound each check
# allows past the timeout is unchanged).
test-faults: install install-torch
	$(call both-backends,faults,tests/test_fault_phases.py -m faults)
	$(call DURATIONS_FILE,faults-torch) KERAS_BACKEND=torch $(VENV_TORCH)/bin/python -m pytest -q -rs -m "not stress" \
	  tests/test_fault_tolerance.py::test_killed_or_terminated_worker_resumes_through_backup_and_restore

# The oldest supported Keras (KERAS_MIN), overlaid on the same environment:
# the hooks, the architecture checks and the equivalence tests that meet
# what a Keras release changes (uneven shards with Adam, the on-batch
# methods), on both backends side by side (CI runs it after `make test`,
# which tests the newest Keras; 2.7 CPU-min, about 2 min).
$(KERAS_MIN_DIR)/.installed: $(STAMP)
	test -d $(KERAS_MIN_DIR)/keras || $(PY) -m pip install -q --no-deps --target $(KERAS_MIN_DIR) keras==$(KERAS_MIN)
	touch $@

test-keras-min: install install-torch $(KERAS_MIN_DIR)/.installed
	@rm -f $(TEST_LOGS)/test-keras-min-*.log $(TEST_LOGS)/durations/keras-min-*.json; mkdir -p $(TEST_LOGS)/durations
	@$(PYTHON) tests/run_parts.py --jobs 2 --logs $(TEST_LOGS) test-keras-min-tensorflow test-keras-min-jax test-keras-min-torch

# $(call OVERLAID_TESTS,TAG,DIR,VERSION,BACKEND,TESTS): TESTS under the Keras
# overlaid from DIR (its VERSION expected), logs and temp dirs named TAG.
# (Explicit targets below: make skips pattern rules for .PHONY targets.)
OVERLAY_TESTS := tests/test_keras_version.py tests/test_hooks.py tests/test_architecture.py tests/test_keras_distribution.py \
	"tests/test_equivalence.py" -k "not test_equivalence or (partial and adam) or on_batch"
OVERLAID_TESTS = $(call DURATIONS_FILE,$(1)-$(4)) PYTHONPATH=$(2) KERAS_BACKEND=$(4) KERAS_DIST_EXPECT_KERAS=$(3) \
	  $(if $(filter torch,$(4)),KERAS_DIST_SINGLE_BACKEND=torch $(VENV_TORCH)/bin/python -m pytest -q -rs,$(PYTEST)) \
	  --basetemp=$(CURDIR)/$(TEST_LOGS)/tmp-$(1)-$(4) -m "not stress and not faults and not zoo and not bench" $(5)

test-keras-min-jax: install $(KERAS_MIN_DIR)/.installed
	$(call JAX_TEST_CACHE,keras-min) $(call OVERLAID_TESTS,keras-min,$(KERAS_MIN_DIR),$(KERAS_MIN),jax,$(OVERLAY_TESTS))

test-keras-min-tensorflow: install $(KERAS_MIN_DIR)/.installed
	$(call OVERLAID_TESTS,keras-min,$(KERAS_MIN_DIR),$(KERAS_MIN),tensorflow,$(OVERLAY_TESTS))

# torch: the oldest Keras over the torch-only venv, its own tests (the workers too).
test-keras-min-torch: install-torch $(KERAS_MIN_DIR)/.installed
	$(call OVERLAID_TESTS,keras-min,$(KERAS_MIN_DIR),$(KERAS_MIN),torch,tests/test_keras_version.py tests/test_torch_backend.py)

# The next Keras (KERAS_NIGHTLY, keras-nightly on the package index),
# overlaid as KERAS_MIN is: the hooks (names, signatures, liveness), the
# architecture checks, Keras' own distribution beside keras_dist, the
# equivalence tests that meet what a release changes, an example that
# matches one device, and a multi-worker job through the launcher, on every
# backend (torch: its own tests, with their multi-worker jobs). CI runs it
# after `make test`; `make test` runs a sample (tests/test_keras_version.py).
$(KERAS_NIGHTLY_DIR)/.installed:
	test -d $(KERAS_NIGHTLY_DIR)/keras || $(PYTHON) -m pip install -q --no-deps --target $(KERAS_NIGHTLY_DIR) keras-nightly==$(KERAS_NIGHTLY)
	touch $@

test-keras-nightly: install install-torch $(KERAS_NIGHTLY_DIR)/.installed
	@rm -f $(TEST_LOGS)/test-keras-nightly-*.log $(TEST_LOGS)/durations/keras-nightly-*.json; mkdir -p $(TEST_LOGS)/durations
	@$(PYTHON) tests/run_parts.py --jobs 2 --logs $(TEST_LOGS) test-keras-nightly-tensorflow test-keras-nightly-jax test-keras-nightly-torch

NIGHTLY_EXAMPLES := tests/test_docs.py::test_example_digits_cnn_matches_single_device tests/test_multi_worker.py::test_example_through_the_launcher

test-keras-nightly-jax: install $(KERAS_NIGHTLY_DIR)/.installed
	$(call JAX_TEST_CACHE,keras-nightly) $(call OVERLAID_TESTS,keras-nightly,$(KERAS_NIGHTLY_DIR),$(KERAS_NIGHTLY),jax,$(NIGHTLY_EXAMPLES) $(OVERLAY_TESTS))

test-keras-nightly-tensorflow: install $(KERAS_NIGHTLY_DIR)/.installed
	$(call OVERLAID_TESTS,keras-nightly,$(KERAS_NIGHTLY_DIR),$(KERAS_NIGHTLY),tensorflow,$(NIGHTLY_EXAMPLES) $(OVERLAY_TESTS))

test-keras-nightly-torch: install-torch $(KERAS_NIGHTLY_DIR)/.installed
	$(call OVERLAID_TESTS,keras-nightly,$(KERAS_NIGHTLY_DIR),$(KERAS_NIGHTLY),torch,tests/test_keras_version.py \
	  tests/test_torch_backend.py tests/test_keras_distribution.py tests/test_multi_worker.py::test_example_through_the_launcher)

bench: install
	$(PY) benchmarks/run.py
	$(PY) benchmarks/weak_scaling.py
	$(PY) benchmarks/per_worker_input.py
	$(PY) benchmarks/parameter_server.py

clean:
	rm -rf $(VENV) $(VENV_JAX) $(VENV_TF) $(KERAS_MIN_DIR) $(KERAS_NIGHTLY_DIR) $(ZOO_DIR) $(TEST_LOGS) build *.egg-info
