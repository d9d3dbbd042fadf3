"""`keras_dist._hooks._sigterm`: how a multi-worker `fit` agrees on when to
stop after a SIGTERM, run in one process (the exchange of one worker's flag
is then its own row). The 2-worker jobs through the launcher, on both
backends: tests/test_fault_tolerance.py."""

import signal
import time

import keras
import numpy as np
import pytest

from keras_dist._hooks import _sigterm


class _Recorder(keras.callbacks.Callback):
    """Each step lasts `seconds` more (on `clock` if given, else slept);
    raises the SIGTERM flag after step `at`."""

    def __init__(self, notice, at, seconds, clock=None):
        super().__init__()
        self.notice, self.at, self.seconds, self.clock = notice, at, seconds, clock

    def on_train_batch_end(self, batch, logs=None):
        if self.clock is not None:
            self.clock.now += self.seconds
        else:
            time.sleep(self.seconds)
        if batch + 1 == self.at:
            self.notice["received"] = True


class _Clock:
    """`time` for `_sigterm`: `perf_counter()` moves only when a step says
    so, so the exchanges' cadence does not depend on the machine's load (a
    loaded machine made real 50 ms steps 100 ms long)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def _fit(callback, recorder, steps=12, epochs=1):
    x = np.zeros((steps * 2, 3), "float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, x[:, :1], batch_size=2, epochs=epochs, verbose=0, callbacks=[recorder, callback])


def test_the_workers_stop_at_the_next_exchange(monkeypatch):
    monkeypatch.setattr(_sigterm, "EXCHANGE_SECONDS", 0.0)  # an exchange after every step
    notice = {"received": False}
    with pytest.raises(_sigterm._Terminated, match="SIGTERM reached worker 0; every worker stops after step 5 of epoch 1"):
        _fit(_sigterm._AgreeOnTermination(notice, 0, 2), _Recorder(notice, 5, 0.0))


def test_exchanges_come_about_every_exchange_seconds(monkeypatch):
    """Steps of 50 ms and exchanges every 0.2 s: 4 steps apart (the first
    one after step 1), so a notice after step 5 stops at the first exchange
    from step 5 on, and fewer exchanges than steps were made."""
    monkeypatch.setattr(_sigterm, "EXCHANGE_SECONDS", 0.2)
    clock = _Clock()
    monkeypatch.setattr(_sigterm, "time", clock)
    notice = {"received": False}
    exchanges = []

    class Counting(_sigterm._AgreeOnTermination):
        def _exchange(self, step_micros):
            exchanges.append(self._calls)
            return super()._exchange(step_micros)

    with pytest.raises(_sigterm._Terminated) as stopped:
        _fit(Counting(notice, 0, 2), _Recorder(notice, 5, 0.05, clock))
    step = int(str(stopped.value).split("after step ")[1].split()[0])
    assert exchanges == [1, 5], exchanges  # after step 1, then 0.2 s / 50 ms = 4 steps later
    assert step == 5, stopped.value


def test_a_notice_late_in_the_epoch_stops_at_its_end(monkeypatch):
    """Exchanges far apart (fast steps): the epoch's end exchanges too."""
    monkeypatch.setattr(_sigterm, "EXCHANGE_SECONDS", 1000.0)
    notice = {"received": False}
    with pytest.raises(_sigterm._Terminated, match="every worker stops at the end of epoch 1 and exits with code 42"):
        _fit(_sigterm._AgreeOnTermination(notice, 0, 2), _Recorder(notice, 5, 0.0), epochs=2)


class _Extended:
    num_workers, worker_index = 2, 1


class _Strategy:
    extended = _Extended()


def test_the_handler_is_chained_and_restored_and_the_stop_exits_42(capsys):
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        with pytest.raises(SystemExit) as exited:
            with _sigterm.stop_on_sigterm(_Strategy()) as callback:
                signal.raise_signal(signal.SIGTERM)  # the user's handler runs too
                assert callback._notice["received"] and calls == [signal.SIGTERM]
                callback._stop_if_noticed(callback._exchange(0), "after step 3 of epoch 1")
        assert exited.value.code == 42
        assert "keras_dist: worker 1 of 2: SIGTERM reached worker 0; every worker stops after step 3" in capsys.readouterr().err
        assert signal.getsignal(signal.SIGTERM) is not None and signal.getsignal(signal.SIGTERM).__name__ == "<lambda>"
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_ignored_sigterm_stays_ignored():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with _sigterm.stop_on_sigterm(_Strategy()) as callback:
            assert callback is None
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
