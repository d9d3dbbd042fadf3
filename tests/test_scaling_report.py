"""keras_dist.callbacks.ScalingReport: consistent numbers, a valid PNG
written only by the chief, hints that fire when they should and only then,
and training unchanged by it. Speed itself is never asserted (timings on a
shared machine are noise); the hints tested here depend on facts (device
kinds, core count, batch size) or on a wait made far longer than the step."""

import time

import numpy as np
import pytest
import keras

from keras_dist.callbacks import ScalingReport, ScalingResult
from keras_dist.callbacks import _report
from _helpers import FEATURES, compile_model, make_data, mlp
from conftest import BACKEND

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _assert_valid_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", data[:16]
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 100 and height > 100
    assert data.rstrip(b"\x00")[-8:-4] == b"IEND"


def _assert_consistent(result: ScalingResult, replicas, global_batch):
    assert result.replicas == replicas
    assert result.global_batch == global_batch
    assert result.per_replica_batch == -(-global_batch // replicas)
    assert set(result.fractions) == set(_report.PARTS) == set(result.seconds)
    assert all(value >= 0 for value in result.fractions.values())
    assert sum(result.fractions.values()) == pytest.approx(1.0, abs=1e-6)
    assert sum(result.seconds.values()) == pytest.approx(result.step_seconds, rel=1e-6)
    assert result.samples_per_second > 0 and result.step_seconds > 0 and result.steps > 0
    assert result.first_step_seconds > 0


def _wide_model(strategy=None, units=64, hidden=1):
    def build():
        keras.utils.set_random_seed(0)
        dense = [keras.layers.Dense(units, activation="relu") for _ in range(hidden)]
        model = keras.Sequential([keras.Input((FEATURES,)), *dense, keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    if strategy is None:
        return build()
    with strategy.scope():
        return build()


def test_report_of_a_distributed_fit(mirrored, tmp_path, capsys):
    x, y = make_data(64 * 6)
    model = _wide_model(mirrored(4))
    plot = tmp_path / "plots" / "scaling.png"
    report = ScalingReport(plot_path=str(plot))
    model.fit(x, y, batch_size=64, epochs=2, verbose=0, callbacks=[report])
    result = report.result
    _assert_consistent(result, replicas=4, global_batch=64)
    assert 6 <= result.steps <= 11  # 12 steps; the first (compilation), and outliers, not counted
    assert result.devices == ("cpu:0", "cpu:1", "cpu:2", "cpu:3") and result.backend == BACKEND
    assert result.seconds["communication"] > 0 and result.gradient_bytes == 4 * (FEATURES * 64 + 64 + 64 + 1)
    assert result.reference_source == "measured" and result.reference_samples_per_second > 0
    assert result.speedup == pytest.approx(result.samples_per_second / result.reference_samples_per_second)
    assert result.efficiency == pytest.approx(result.speedup / 4)
    _assert_valid_png(plot)
    assert [p.name for p in plot.parent.iterdir()] == ["scaling.png"]  # no temporary left
    assert result.plot_path == str(plot)
    printed = capsys.readouterr().out
    assert printed.startswith("ScalingReport: 4 replica(s) on " + BACKEND)
    for words in ("waiting for input", "compute", "cross-replica communication", "host overhead", "samples/s"):
        assert words in printed
    assert model.train_function is not None and not hasattr(model.train_function, "__keras_dist_untimed__")


def test_report_of_a_plain_keras_model(tmp_path):
    x, y = make_data(32 * 5)
    model = _wide_model()
    report = ScalingReport(plot_path=str(tmp_path / "plain.png"), verbose=False)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[report])
    result = report.result
    _assert_consistent(result, replicas=1, global_batch=32)
    assert result.seconds["communication"] == 0 and result.communication_estimate_seconds == 0
    assert result.reference_source == "this run" and result.speedup == 1.0
    assert not any("CPU devices sharing" in hint or "per step" in hint for hint in result.hints)
    _assert_valid_png(tmp_path / "plain.png")


@pytest.mark.parametrize("distributed", [False, True])
def test_training_is_unchanged_by_the_report(mirrored, distributed):
    x, y = make_data(43)
    histories, weights = [], []
    for attach in (False, True):
        if distributed:
            with mirrored(2).scope():
                model = compile_model(mlp(batch_norm=True), "adam")
        else:
            model = compile_model(mlp(batch_norm=True), "adam")
        callbacks = [ScalingReport(measure_reference=False, verbose=False)] if attach else []
        histories.append(model.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0, callbacks=callbacks).history)
        weights.append(model.get_weights())
    if BACKEND == "tensorflow" and not distributed:
        # Keras' TF loop takes the batches in Python while timed: same steps,
        # compiled on their own instead of inside its loop (round-off only)
        for a, b in zip(*weights):
            np.testing.assert_allclose(a, b, atol=1e-6)
        assert histories[0].keys() == histories[1].keys()
        return
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)
    assert histories[0] == histories[1]


def test_shared_cores_and_small_batch_hints(mirrored, monkeypatch):
    monkeypatch.setattr(_report, "available_cores", lambda: 2)
    x, y = make_data(8 * 5)
    model = _wide_model(mirrored(4))
    report = ScalingReport(measure_reference=False, verbose=False)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[report])
    hints = report.result.hints
    assert report.result.per_replica_batch == 2 and report.result.cores == 2
    assert any(h.startswith("4 replicas are CPU devices sharing 2 CPU cores") for h in hints), hints
    assert any(h.startswith("Each replica gets only 2 examples per step") and "128" in h for h in hints), hints
    assert "hints:" in report.result.text()


def test_no_hints_when_nothing_is_wrong(mirrored, monkeypatch):
    monkeypatch.setattr(_report, "available_cores", lambda: 64)
    x, y = make_data(2048 * 5)
    model = _wide_model(mirrored(2), units=512, hidden=2)  # compute dominates
    # a given reference (pretend one replica is slow) makes the speedup > 1
    report = ScalingReport(reference_samples_per_second=1.0, verbose=False)
    model.fit(x, y, batch_size=2048, epochs=1, verbose=0, callbacks=[report])
    result = report.result
    assert result.reference_source == "given" and result.speedup > 1
    assert result.hints == (), (result.hints, result.fractions)
    assert "no hints" in result.text()


class _SlowInput(keras.utils.PyDataset):
    def __init__(self, batches, delay):
        super().__init__()
        self.x, self.y = make_data(16 * batches)
        self.batches, self.delay = batches, delay

    def __len__(self):
        return self.batches

    def __getitem__(self, index):
        time.sleep(self.delay)
        rows = slice(16 * index, 16 * (index + 1))
        return self.x[rows], self.y[rows]


def test_input_bound_hint():
    model = _wide_model()
    report = ScalingReport(verbose=False)
    model.fit(_SlowInput(batches=5, delay=0.1), epochs=1, verbose=0, callbacks=[report])
    result = report.result
    assert result.fractions["input"] > 0.5, result.fractions
    assert any("waits for the next batch: training is input-bound" in h for h in result.hints), result.hints


def test_hint_rules():
    calm = {"input": 0.05, "compute": 0.8, "communication": 0.1, "host": 0.05}
    assert _report.hints_for(4, 4, 8, 64, calm, speedup=3.5) == ()
    assert _report.hints_for(1, 0, 1, 4, calm, speedup=None) == ()  # one replica: no batch hint
    slower = _report.hints_for(4, 0, 8, 64, calm, speedup=0.8)
    assert len(slower) == 1 and slower[0].startswith("Distribution costs more than it gives")
    busy = {"input": 0.3, "compute": 0.1, "communication": 0.3, "host": 0.3}
    kinds = ["input-bound", "sums gradients", "host overhead"]
    hints = _report.hints_for(2, 0, 8, 64, busy, speedup=None)
    assert [any(k in h for h in hints) for k in kinds] == [True, True, True], hints


def test_only_the_chief_prints_and_writes(mirrored, monkeypatch, tmp_path, capsys):
    from keras_dist.callbacks import _scaling_report

    monkeypatch.setattr(_scaling_report, "_is_chief", lambda strategy: False)  # a worker's view
    x, y = make_data(32 * 3)
    model = _wide_model(mirrored(2))
    report = ScalingReport(plot_path=str(tmp_path / "chief_only.png"))
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[report])
    assert report.result is not None and report.result.reference_source is None  # not measured
    assert not (tmp_path / "chief_only.png").exists() and report.result.plot_path is None
    assert "ScalingReport" not in capsys.readouterr().out


def test_bad_arguments_and_missing_matplotlib(monkeypatch):
    with pytest.raises(TypeError, match="plot_path must be a file path"):
        ScalingReport(plot_path=3)
    with pytest.raises(ValueError, match="reference_samples_per_second must be a positive number"):
        ScalingReport(reference_samples_per_second=0)
    with pytest.raises(ValueError, match="reference_steps must be an integer >= 1"):
        ScalingReport(reference_steps=0)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(ImportError, match="pip install matplotlib"):
        ScalingReport(plot_path="scaling.png")
    ScalingReport()  # no plot, no matplotlib needed


def test_the_arithmetic_on_recorded_steps():
    """Synthetic timings: every step 10 ms (2 ms fetching, 6 ms in the step,
    1 ms more until the callback, 1 ms until the next step), 32 rows; the
    first step (compilation) and one 500 ms step are left out."""
    report = ScalingReport(verbose=False)
    report.set_model(_wide_model())
    clock, steps = 0.0, []
    for index in range(12):
        call = 0.5 if index == 6 else 0.008
        steps.append({"epoch": 0, "begin": clock, "call": call, "fetch": 0.002, "batches": 1, "rows": 32,
                      "end": clock + call + 0.001})
        clock += call + 0.002
    report._steps = steps
    result = report._analyse(strategy=None, chief=True)
    assert result.steps == 10 and result.global_batch == 32
    assert result.step_seconds == pytest.approx(0.010)
    assert result.seconds == pytest.approx({"input": 0.002, "compute": 0.006, "communication": 0.0, "host": 0.002})
    assert result.samples_per_second == pytest.approx(3200)
    assert any("1 step(s) left out" in note for note in result.notes), result.notes
    assert result.first_step_seconds == pytest.approx(0.010)
