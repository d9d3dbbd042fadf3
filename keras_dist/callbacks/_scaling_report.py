"""`ScalingReport`: where the step time of `fit` goes (backend-agnostic)."""

from __future__ import annotations

import math
import statistics
import threading
import time
from typing import Optional

import keras
import numpy as np

from keras_dist import _context
from keras_dist._context import model_strategy
from keras_dist.backends import backend_name, get_adapter
from keras_dist.callbacks import _plot, _timing
from keras_dist.callbacks._report import PARTS, ScalingResult, available_cores, hints_for

#: Steps slower than this many times the median are left out (compilation).
OUTLIER_FACTOR = 5


class ScalingReport(keras.callbacks.Callback):
    """Tells, at the end of `fit`, where the step time went and whether
    distributing paid off; optionally plots it.

    Works for models under any keras_dist strategy and for plain Keras
    models (then it reports one replica). A step is split into four parts:

    - **waiting for input** (measured): time spent fetching batches from the
      input iterator;
    - **cross-replica communication** (estimated): after training, an
      all-reduce of buffers the size of the model's gradients is timed
      through the strategy's own engine (same devices, same cross-device
      ops), once per step; 0 with one replica;
    - **compute** (measured, minus the estimate): the rest of the step, from
      the batch in hand until the step's logs are computed;
    - **host overhead** (measured): the time between steps (Keras' loop,
      callbacks, the progress bar).

    Throughput is measured: rows trained / time, over all steps but the
    first (which includes compilation) and any step over 5x the median step
    (a recompilation, e.g. for a partial last batch; a note says so). To time steps rather than their
    dispatch, each step's logs are waited for (JAX otherwise runs ahead
    asynchronously), which can cost a little overlap.

    Efficiency compares against one replica on the per-replica batch: give
    its throughput as `reference_samples_per_second`, or let the report
    measure it (`measure_reference=True`, the default, with more than one
    replica): a plain-Keras copy of the model (`keras.models.clone_model`,
    compiled from the model's compile config) is fitted for
    ``reference_steps + 1`` steps on one replica's rows of the first batch,
    repeated, on this process's default device, and timed the same way
    (the first step not counted; about a second, mostly compilation).
    Models that cannot be cloned get no reference (a note says so).

    Only the chief (`strategy.extended.should_checkpoint`) prints and
    writes the plot; every worker computes `result` (the communication
    timing is a collective, so every worker must run the callback). In
    multi-worker jobs no one-replica reference is measured (pass one).

    Args:
        plot_path: where to write a PNG of the report (needs matplotlib;
            written to a temporary file, then renamed). None: no plot.
        reference_samples_per_second: one replica's measured throughput on
            the per-replica batch, if you have it.
        measure_reference: measure one replica when no reference is given.
        reference_steps: steps timed for the one-replica reference.
        verbose: print the report at the end of `fit`.

    Attributes:
        result: the `ScalingResult` of the last `fit` (None before).

    ```python
    report = keras_dist.callbacks.ScalingReport(plot_path="scaling.png")
    model.fit(x, y, batch_size=256, epochs=2, callbacks=[report])
    print(report.result.fractions, report.result.samples_per_second)
    ```
    """

    def __init__(
        self,
        plot_path: Optional[str] = None,
        *,
        reference_samples_per_second: Optional[float] = None,
        measure_reference: bool = True,
        reference_steps: int = 10,
        verbose: bool = True,
    ):
        super().__init__()
        if plot_path is not None:
            if not isinstance(plot_path, str) or not plot_path:
                raise TypeError(f"plot_path must be a file path (str) or None, got {plot_path!r}.")
            _plot.check_matplotlib()
        if reference_samples_per_second is not None and not (
            isinstance(reference_samples_per_second, (int, float))
            and not isinstance(reference_samples_per_second, bool)
            and reference_samples_per_second > 0
        ):
            raise ValueError(
                "reference_samples_per_second must be a positive number (one "
                f"replica's samples/s), got {reference_samples_per_second!r}."
            )
        if isinstance(reference_steps, bool) or not isinstance(reference_steps, int) or reference_steps < 1:
            raise ValueError(f"reference_steps must be an integer >= 1, got {reference_steps!r}.")
        self.plot_path = plot_path
        self.reference_samples_per_second = reference_samples_per_second
        self.measure_reference = measure_reference
        self.reference_steps = reference_steps
        self.verbose = verbose
        self.result: Optional[ScalingResult] = None
        self._undo = None

    # -- collecting ---------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._steps = []
        self._pending = None
        self._epoch = 0
        self._first_batch = None
        if self._undo is not None:
            self._undo()
        self._undo = _timing.time_train_function(self.model, self._record_call)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self._pending = {"epoch": self._epoch, "begin": time.perf_counter()}

    def _record_call(self, start, end, fetch_seconds, batches, rows, first_batch):
        if self._first_batch is None:
            self._first_batch = first_batch
        if self._pending is not None:
            self._pending.update(call=end - start, fetch=fetch_seconds, batches=batches, rows=rows)

    def on_train_batch_end(self, batch, logs=None):
        pending, self._pending = self._pending, None
        if pending is not None and "call" in pending:
            pending["end"] = time.perf_counter()
            self._steps.append(pending)

    def on_train_end(self, logs=None):
        if self._undo is not None:
            self._undo()
            self._undo = None
        if not self._steps:
            return
        strategy = model_strategy(self.model)
        chief = _is_chief(strategy)
        self.result = self._analyse(strategy, chief)
        if chief and self.plot_path:
            path = _plot.write_plot(self.result, self.plot_path)
            self.result = _replace(self.result, plot_path=path)
        if chief and self.verbose:
            print(self.result.text(), flush=True)

    # -- analysing ----------------------------------------------------------

    def _analyse(self, strategy, chief: bool) -> ScalingResult:
        steps = self._steps
        notes = []
        for index, step in enumerate(steps):  # the time until the next step
            following = steps[index + 1] if index + 1 < len(steps) else None
            if following is not None and following["epoch"] == step["epoch"]:
                step["gap"] = following["begin"] - step["end"]
        gaps = [s["gap"] for s in steps if "gap" in s]
        typical_gap = statistics.median(gaps) if gaps else 0.0
        for step in steps:
            step["wall"] = step["end"] - step["begin"] + step.get("gap", typical_gap)
        first = steps[0]
        first_step = first["wall"]
        timed = steps[1:]
        if not timed:
            timed = steps
            notes.append("only one training call: its time includes compilation")
        elif len(timed) >= 3:  # leave out compilations (e.g. a partial last batch's new shape)
            per_batch = [s["wall"] / max(s["batches"], 1) for s in timed]
            limit = OUTLIER_FACTOR * statistics.median(per_batch)
            slow = [s for s, t in zip(timed, per_batch) if t > limit]
            if slow and len(slow) < len(timed) / 2:
                timed = [s for s, t in zip(timed, per_batch) if t <= limit]
                notes.append(
                    f"{len(slow)} step(s) left out, each over {OUTLIER_FACTOR}x the median "
                    f"step ({max(s['wall'] / max(s['batches'], 1) for s in slow) * 1e3:.1f} ms "
                    f"vs {limit / OUTLIER_FACTOR * 1e3:.2f} ms): most likely compilation, e.g. "
                    "for a partial last batch's new shape"
                )
        if sum(s["batches"] for s in timed) < 3:
            notes.append("fewer than 3 timed steps: the numbers are rough")

        wall = call = fetch = 0.0
        batches = rows = 0
        for s in timed:
            wall += s["wall"]
            call += min(s["call"], s["wall"])
            fetch += min(s["fetch"], s["call"])
            batches += s["batches"]
            rows += s["rows"]
        batches = max(batches, 1)
        step_seconds = wall / batches
        program = (call - fetch) / batches

        replicas = strategy.num_replicas_in_sync if strategy is not None else 1
        variables = [v for v in self.model.trainable_variables if int(np.prod(v.shape)) > 0]
        shapes = [(tuple(int(d) for d in v.shape), str(v.dtype)) for v in variables]
        gradient_bytes = sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in shapes)
        estimate = 0.0
        if replicas > 1 and shapes:
            estimate = get_adapter().time_all_reduce(strategy.extended.engine, shapes)
        communication = min(estimate, program)
        seconds = {
            "input": fetch / batches,
            "compute": program - communication,
            "communication": communication,
            "host": max(0.0, (wall - call) / batches),
        }
        total = sum(seconds.values()) or 1.0
        fractions = {part: seconds[part] / total for part in PARTS}

        sizes = [s["rows"] / s["batches"] for s in steps if s["batches"]]
        global_batch = int(round(max(sizes))) if sizes else 0
        per_replica_batch = math.ceil(global_batch / replicas) if global_batch else 0
        samples_per_second = rows / wall if wall > 0 else 0.0

        reference, source = None, None
        if replicas == 1:
            reference, source = samples_per_second, "this run"
        elif self.reference_samples_per_second is not None:
            reference, source = float(self.reference_samples_per_second), "given"
        elif self.measure_reference and chief and _workers(strategy) > 1:
            notes.append(
                "no one-replica reference: not measured in multi-worker jobs (the "
                "model's state spans the workers); pass "
                "ScalingReport(reference_samples_per_second=...) for the speedup and efficiency"
            )
        elif self.measure_reference and chief and self._first_batch is not None:
            try:
                reference = _measure_one_replica(
                    self.model, self._first_batch, per_replica_batch, self.reference_steps
                )
                source = "measured"
            except Exception as error:  # noqa: BLE001 - reported, not raised
                notes.append(
                    f"no one-replica reference ({type(error).__name__}: {error}); pass "
                    "ScalingReport(reference_samples_per_second=...) to get the "
                    "speedup and efficiency"
                )
        speedup = samples_per_second / reference if reference else None
        efficiency = speedup / replicas if speedup is not None else None

        devices = tuple(strategy.extended.worker_devices) if strategy is not None else ("one device, no strategy",)
        cpu_replicas = sum(1 for d in devices if d.startswith("cpu:"))  # on this host
        if _workers(strategy) > 1:
            devices = (f"{_workers(strategy)} workers; this one: {', '.join(devices)}",)
        cores = available_cores()
        hints = list(hints_for(replicas, cpu_replicas, cores, per_replica_batch, fractions, speedup))
        if hints and hints[0].startswith("Distribution costs more") and len(hints) == 1:
            hints[0] = hints[0].replace(
                "The hints below say why.",
                "No single part of the step stands out: the work per step is "
                "likely too small to split; try a larger batch.",
            )
        ops = strategy.extended.cross_device_ops if strategy is not None else None
        return ScalingResult(
            backend=backend_name(),
            replicas=replicas,
            devices=devices,
            cross_device_ops=None if ops is None else repr(ops),
            global_batch=global_batch,
            per_replica_batch=per_replica_batch,
            steps=sum(s["batches"] for s in timed),
            first_step_seconds=first_step,
            step_seconds=step_seconds,
            seconds=seconds,
            fractions=fractions,
            samples_per_second=samples_per_second,
            communication_estimate_seconds=estimate,
            gradient_bytes=gradient_bytes,
            reference_samples_per_second=reference,
            reference_source=source,
            speedup=speedup,
            efficiency=efficiency,
            cores=cores,
            hints=tuple(hints),
            notes=tuple(notes),
        )


def _workers(strategy) -> int:
    """Worker processes of the job (1 unless multi-worker)."""
    return strategy.extended.num_workers if strategy is not None else 1


def _is_chief(strategy) -> bool:
    """Whether this process prints and writes files (one process: yes)."""
    return strategy is None or strategy.extended.should_checkpoint


def _replace(result: ScalingResult, **changes) -> ScalingResult:
    import dataclasses

    return dataclasses.replace(result, **changes)


def _measure_one_replica(model, batch, rows: int, steps: int) -> float:
    """Samples/s of a plain-Keras copy of `model` on `rows` rows of `batch`.

    The copy trains ``steps + 1`` batches (one replica's rows of `batch`,
    repeated) with `fit`, timed by a `ScalingReport` of its own, so both
    sides are measured alike (the first step, with compilation, not
    counted). It runs in a fresh thread with no strategy scope entered, so
    it is ordinary single-device Keras (Keras' and TensorFlow's scopes are
    per-thread; keras_dist's is lifted meanwhile).
    """
    config = model.get_compile_config()
    if not config:
        raise ValueError("the model has no serializable compile config")
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)

    def repeat(value):
        if value is None:
            return None
        return keras.tree.map_structure(
            lambda a: np.concatenate([keras.ops.convert_to_numpy(a)[:rows]] * (steps + 1)), value
        )

    outcome = {}

    def work():
        try:
            copy = keras.models.clone_model(model)
            if not copy.compiled:
                copy.compile_from_config(config)
            report = ScalingReport(measure_reference=False, verbose=False)
            copy.fit(
                repeat(x),
                repeat(y),
                sample_weight=repeat(sample_weight),
                batch_size=rows,
                epochs=1,
                shuffle=False,
                verbose=0,
                callbacks=[report],
            )
            outcome["samples_per_second"] = report.result.samples_per_second
        except Exception as error:  # noqa: BLE001 - handed to the caller
            outcome["error"] = error

    with _context.outside_strategies():
        thread = threading.Thread(target=work, name="keras-dist-scaling-reference")
        thread.start()
        thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["samples_per_second"]
