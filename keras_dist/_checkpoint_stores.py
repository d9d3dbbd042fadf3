"""The checkpoints `PreemptionCheckpointHandler` writes, finds and restores,
one `CheckpointStore` per kind: a Keras model (`save_weights`, with its
optimizer's state), an object with `save(path)`/`restore(path)`, and, from
the TensorFlow adapter, `tf.train.Checkpoint`/`CheckpointManager`
(`backends/tensorflow/_checkpoint.py`).

A checkpoint is `ckpt-<run count><suffix>` in the handler's directory:
written under a temporary name, renamed into place (the commit), then the
older ones removed, so a process killed at any moment leaves the previous
checkpoint or the new one, whole.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from typing import Optional

from keras_dist import _foreign

_logger = logging.getLogger("keras_dist")


class CheckpointStore:
    """How a handler writes, finds and restores one kind of checkpoint.

    keras_dist's kinds (a Keras model; an object with `save(path)` and
    `restore(path)`) are below; the TensorFlow adapter gives one for
    `tf.train.Checkpoint` / `tf.train.CheckpointManager`.
    """

    #: Where the checkpoints are, for messages (set by `open`).
    directory: str = ""

    def open(self, checkpoint_dir: Optional[str]) -> None:
        """Takes the handler's `checkpoint_dir` (raises if this kind needs one)."""
        raise NotImplementedError

    def latest(self) -> Optional[tuple[int, str]]:
        """(run count, name) of the newest whole checkpoint, or None."""
        raise NotImplementedError

    def restore(self, name: str) -> None:
        """Loads the checkpoint `latest` named."""
        raise NotImplementedError

    def save(self, runs: int, directory: Optional[str], args: tuple, kwargs: dict) -> str:
        """Writes the checkpoint of `runs` run calls, atomically, leaving
        only it; into `directory` (a non-chief's private one) when given,
        else the real one. Returns where."""
        raise NotImplementedError

    def note_runs(self, runs: int) -> None:
        """Before a user's `save_fn`: the run count, for kinds that hold it."""


_COMMITTED = re.compile(r"ckpt-(\d+)")
#: A directory checkpoint moved aside for one of the same run count (kept
#: until that one is in place, the fallback if the process dies between).
_ASIDE = re.compile(r"\.ckpt-(\d+)\.tmp-\d+-replaced")


class _FileStore(CheckpointStore):
    """`ckpt-<runs><suffix>` files (or directories) in `checkpoint_dir`: a
    temporary name, renamed into place, then the older ones removed."""

    suffix = ""
    what = ""

    def open(self, checkpoint_dir):
        if checkpoint_dir is None:
            raise ValueError(
                f"PreemptionCheckpointHandler: with {self.what}, give checkpoint_dir: "
                "the directory (one every worker sees) where the checkpoints go."
            )
        if not isinstance(checkpoint_dir, (str, os.PathLike)) or not os.fspath(checkpoint_dir):
            raise TypeError(f"PreemptionCheckpointHandler: checkpoint_dir must be a path, got {checkpoint_dir!r}.")
        self.directory = os.fspath(checkpoint_dir)

    def _committed(self, directory: str, pattern=_COMMITTED) -> list[tuple[int, str]]:
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            if not name.endswith(self.suffix):
                continue
            match = pattern.fullmatch(name[: len(name) - len(self.suffix)])
            if match:
                found.append((int(match.group(1)), name))
        return sorted(found)

    def latest(self):
        found = self._committed(self.directory) or self._committed(self.directory, _ASIDE)
        return found[-1] if found else None

    def save(self, runs, directory, args, kwargs):
        directory = directory or self.directory
        os.makedirs(directory, exist_ok=True)
        for name in os.listdir(directory):  # left by a process killed mid-write
            if name.startswith(".ckpt-") and ".tmp-" in name and "-replaced" not in name:
                _remove(os.path.join(directory, name))
        name = f"ckpt-{runs}{self.suffix}"
        temporary = os.path.join(directory, f".{name}.tmp-{os.getpid()}{self.suffix}")
        self._write(temporary, args, kwargs)
        if not os.path.lexists(temporary):
            raise RuntimeError(
                f"PreemptionCheckpointHandler: {self.what}'s save({temporary!r}) wrote "
                "nothing at that path; save(path) must write exactly there (a file or a directory)."
            )
        final = os.path.join(directory, name)
        if os.path.isdir(final) and not os.path.islink(final):
            # The same run count again (restored, then stopped before any
            # run): a directory cannot be replaced in one rename.
            os.replace(final, os.path.join(directory, f".ckpt-{runs}.tmp-{os.getpid()}-replaced{self.suffix}"))
            os.replace(temporary, final)  # the commit; the aside goes with the older ones below
        else:
            os.replace(temporary, final)  # the commit
        for _, other in self._committed(directory) + self._committed(directory, _ASIDE):
            if other != name:
                _remove(os.path.join(directory, other))
        return final

    def restore(self, name):
        self._read(os.path.join(self.directory, name))

    def _write(self, path: str, args: tuple, kwargs: dict) -> None:
        raise NotImplementedError

    def _read(self, path: str) -> None:
        raise NotImplementedError


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


class _KerasModelStore(_FileStore):
    """A Keras model: `save_weights`, which holds the weights and, for a
    compiled model, its optimizer's variables (iterations and slots), so
    training resumes exactly."""

    suffix = ".weights.h5"
    what = "a Keras model"

    def __init__(self, model):
        self.model = model
        if not model.weights:
            raise ValueError(
                "PreemptionCheckpointHandler: the model has no weights yet; build it "
                "(keras.Input, or call it once) before creating the handler, which "
                "restores its checkpoint right away."
            )
        if getattr(model, "optimizer", None) is None:
            _logger.warning(
                "PreemptionCheckpointHandler: the model has no optimizer, so its checkpoints "
                "hold the weights only and a resumed run restarts the optimizer's state. In a "
                "custom training loop, attach the optimizer with model.compile(optimizer=optimizer)."
            )

    def _scope(self):
        from keras_dist._context import model_strategy

        strategy = model_strategy(self.model)
        return strategy.scope() if strategy is not None else contextlib.nullcontext()

    def _write(self, path, args, kwargs):
        with self._scope():
            self.model.save_weights(path, *args, **kwargs)

    def _read(self, path):
        optimizer = getattr(self.model, "optimizer", None)
        with self._scope():
            if optimizer is not None and not optimizer.built:
                optimizer.build(self.model.trainable_variables)  # else Keras skips its state
            self.model.load_weights(path)


class _ObjectStore(_FileStore):
    """Any object with `save(path)` and `restore(path)`: it writes (and
    reads) exactly `path`, a file or a directory."""

    what = "an object with save(path) and restore(path)"

    def __init__(self, value):
        self.value = value

    def _write(self, path, args, kwargs):
        self.value.save(path, *args, **kwargs)

    def _read(self, path):
        self.value.restore(path)


_ACCEPTED = (
    "a Keras model (saved with its optimizer's state), an object with save(path) and "
    "restore(path) methods, or, on the TensorFlow backend, a tf.train.Checkpoint or "
    "tf.train.CheckpointManager"
)


def store_for(value) -> CheckpointStore:
    translated = _foreign.accept(value, "checkpoint")  # tf's, on TensorFlow
    if translated is not value:
        return translated
    import keras

    if isinstance(value, keras.Model):
        return _KerasModelStore(value)
    if callable(getattr(value, "save", None)) and callable(getattr(value, "restore", None)):
        return _ObjectStore(value)
    raise TypeError(
        f"PreemptionCheckpointHandler: checkpoint_or_checkpoint_manager must be {_ACCEPTED}; "
        f"got {type(value).__module__}.{type(value).__qualname__}."
    )
