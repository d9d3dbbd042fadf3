"""Checkpoints and chief-only files: only the chief writes the user's paths
(non-chief workers run the same callbacks into a private temporary
directory), and `BackupAndRestore` commits weights and epoch together with
one rename, so a killed process leaves the previous backup or the new one.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import shutil
import tempfile
from typing import Optional

import keras

from keras_dist import _context
from keras_dist._context import model_strategy


#: Keras callbacks that write files, and the attribute naming where.
_FILE_CALLBACKS = (
    ("ModelCheckpoint", "filepath"),
    ("CSVLogger", "filename"),
    ("TensorBoard", "log_dir"),
)


def private_copy(callback, directory: str):
    """`callback`, writing into `directory` instead of the user's path."""
    if isinstance(callback, keras.callbacks.BackupAndRestore):
        return _private_backup(callback, directory)
    for class_name, attribute in _FILE_CALLBACKS:
        if isinstance(callback, getattr(keras.callbacks, class_name)):
            private = copy.copy(callback)
            path = str(getattr(callback, attribute)).rstrip("/\\")
            setattr(private, attribute, os.path.join(directory, os.path.basename(path)))
            return private
    return callback


BACKUP = "keras.src.callbacks.backup_and_restore:BackupAndRestore"
#: The training metadata, stored in the weights file itself: one rename
#: commits weights and epoch together.
_METADATA_ATTRIBUTE = "keras_dist_training_metadata"


def _private_backup(callback, directory: str):
    """A non-chief worker's BackupAndRestore: restores from the chief's
    backup (the user's `backup_dir`, complete by construction: the chief
    renames finished files into place), writes its own into `directory`."""
    private = copy.copy(callback)  # still reads the user's `_weights_path`
    private.backup_dir = os.path.join(directory, "backup")  # writes, deletes
    return private


def wrap_backup_save(original):
    def _save_model(self):
        strategy = model_strategy(self.model)
        if strategy is None or "://" in str(self.backup_dir):
            return original(self)
        _save_backup_atomically(self)

    return _save_model


def _replace_with_copy(source: str, target: str) -> None:
    temporary = f"{target}.tmp-{os.getpid()}"
    shutil.copyfile(source, temporary)
    os.replace(temporary, target)


def _save_backup_atomically(callback) -> None:
    """Keras' backup, with every file written to a temp name then renamed.

    The weights file carries the training metadata, so killing the process
    at any point leaves the previous backup or the new one, whole.
    """
    import h5py

    directory = callback.backup_dir  # a non-chief's copy: its private dir
    weights = os.path.join(directory, os.path.basename(callback._weights_path))
    metadata_path = os.path.join(
        directory, os.path.basename(callback._training_metadata_path)
    )
    os.makedirs(directory, exist_ok=True)
    for stale in glob.glob(os.path.join(directory, "*.tmp-*")):
        os.remove(stale)  # left by a process killed mid-write
    metadata = json.dumps(
        {"epoch": callback._current_epoch, "batch": callback._last_batch_seen}
    )
    if callback.double_checkpoint:
        for path in (weights, metadata_path):
            if os.path.exists(path):
                _replace_with_copy(path, f"{path}.bkp")
    temporary = f"{weights}.tmp-{os.getpid()}.weights.h5"
    callback.model.save_weights(temporary, overwrite=True)
    with h5py.File(temporary, "a") as handle:
        handle.attrs[_METADATA_ATTRIBUTE] = metadata
    os.replace(temporary, weights)  # the commit point
    temporary = f"{metadata_path}.tmp-{os.getpid()}"
    with open(temporary, "w") as handle:
        handle.write(metadata)
    os.replace(temporary, metadata_path)


def _unreadable_backup(path: str, why: str, backup_dir: str) -> ValueError:
    return ValueError(
        f"BackupAndRestore cannot resume from {path!r}: {why}. Nothing was "
        f"loaded. Delete the backup directory {backup_dir!r} to start training "
        "from epoch 0, or put back a complete backup there."
    )


def _epoch_of(text: str, path: str, backup_dir: str) -> int:
    """The `epoch` of training metadata `text` (from `path`), or one clear error."""
    try:
        epoch = json.loads(text)["epoch"]
    except (ValueError, TypeError, KeyError) as error:
        raise _unreadable_backup(path, f"its training metadata is not valid ({type(error).__name__}: {error})", backup_dir) from error
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise _unreadable_backup(path, f"its training metadata has epoch={epoch!r}, not an epoch number", backup_dir)
    return epoch


def _check_backup(callback) -> Optional[int]:
    """Reads a backup's files before anything is loaded: the epoch the
    weights file carries (None if it has none or there is no backup), or
    one clear error naming the unreadable file and the fix."""
    import h5py

    backup_dir = callback.backup_dir
    epoch = None
    weights = callback._weights_path
    if os.path.exists(weights):
        try:
            with h5py.File(weights, "r") as handle:
                metadata = handle.attrs.get(_METADATA_ATTRIBUTE)
        except OSError as error:
            raise _unreadable_backup(weights, f"the weights file cannot be read ({error})", backup_dir) from error
        if metadata is not None:
            epoch = _epoch_of(metadata, weights, backup_dir)
    path = callback._training_metadata_path
    if os.path.exists(path):
        with open(path) as handle:
            _epoch_of(handle.read(), path, backup_dir)
    return epoch


def wrap_backup_load(original):
    def _load_model(self):
        if model_strategy(self.model) is None:
            return original(self)
        epoch = _check_backup(self)  # before any weight changes
        result = original(self)
        if epoch is not None:  # the weights file's: authoritative over the JSON file
            self.model._initial_epoch = epoch
        return result

    return _load_model


def _worker_tag(strategy) -> str:
    return f"keras_dist_worker{strategy.extended.worker_index}_"


def run_as_non_chief(original, signature, strategy, model, args, kwargs):
    """A non-chief worker runs the same computation (collectives need every
    worker) but prints no progress bar and writes its callbacks' files to a
    private temporary directory, removed afterwards: only the chief writes
    the user's paths."""
    bound = signature.bind(model, *args, **kwargs)
    if "verbose" in signature.parameters:
        bound.arguments["verbose"] = 0
    private = tempfile.mkdtemp(prefix=_worker_tag(strategy))
    try:
        callbacks = bound.arguments.get("callbacks")
        if isinstance(callbacks, (list, tuple)):
            bound.arguments["callbacks"] = [private_copy(c, private) for c in callbacks]
        with strategy.scope():
            return original(*bound.args, **bound.kwargs)
    finally:
        shutil.rmtree(private, ignore_errors=True)


#: What `Model.save` and `Model.save_weights` write as one file, by suffix
#: (a sharded `save_weights`, `max_shard_size`, writes several: not renamed
#: as one; an unzipped `save`, `zipped=False`, writes a directory).
_ONE_FILE_SUFFIXES = {"save": (".keras", ".h5"), "save_weights": (".weights.h5",)}


def _one_file_target(kind: str, filepath, args, kwargs) -> Optional[str]:
    """The local path `kind` writes as one file, or None (a remote or
    file-like target, a sharded or unzipped write, or an existing file the
    user asked not to overwrite: Keras' own prompt decides)."""
    if not isinstance(filepath, (str, os.PathLike)):
        return None
    path = os.fspath(filepath)
    if "://" in path or not path.endswith(_ONE_FILE_SUFFIXES[kind]):
        return None
    if kwargs.get("max_shard_size") is not None or kwargs.get("zipped") is False:
        return None
    overwrite = kwargs.get("overwrite", args[0] if args else True)
    if not overwrite and os.path.exists(path):
        return None
    return path


def _write_atomically(original, model, kind, filepath, args, kwargs):
    """The chief's write: to a temporary file beside the target, renamed into
    place when whole, so a reader (or a process killed mid-write) sees the
    previous file or the new one, never a torn one."""
    path = _one_file_target(kind, filepath, args, kwargs)
    if path is None:
        return original(model, filepath, *args, **kwargs)
    directory, name = os.path.split(os.path.abspath(path))
    suffix = next(s for s in _ONE_FILE_SUFFIXES[kind] if name.endswith(s))
    temporary = os.path.join(directory, f".{name[: -len(suffix)]}.tmp-{os.getpid()}{suffix}")
    try:
        result = original(model, temporary, *args, **kwargs)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    return result


def wrap_chief_only_write(kind: str):
    """`Model.save` / `Model.save_weights` under a strategy: a non-chief
    worker does the same work into a private temporary directory (every
    worker calls it, as in tf.distribute; only the chief's file is the
    user's), and the chief's file is written whole, then renamed."""

    def wrap(original):
        def write(self, filepath, *args, **kwargs):
            strategy = model_strategy(self)
            if strategy is None:
                return original(self, filepath, *args, **kwargs)
            if strategy.extended.should_checkpoint:
                return _write_atomically(original, self, kind, filepath, args, kwargs)
            if not isinstance(filepath, (str, os.PathLike)) or _context.writing_own_path_now():
                return original(self, filepath, *args, **kwargs)  # a file object, or a path: this process's own
            private = tempfile.mkdtemp(prefix=_worker_tag(strategy))
            try:  # same work as the chief, nothing left at the user's path
                target = os.path.join(private, os.path.basename(os.fspath(filepath).rstrip("/\\")))
                return original(self, target, *args, **kwargs)
            finally:
                shutil.rmtree(private, ignore_errors=True)

        return write

    return wrap


def check_orbax_checkpoint(callbacks, strategy, method: str) -> None:
    """`keras.callbacks.OrbaxCheckpoint` (Keras >= 3.13) under a strategy
    whose job is one process (one writer): as in plain Keras. Where several
    processes run the callbacks (a multi-worker job: each would write its
    own checkpoint into the same directory, a torn checkpoint that loads) or
    a parameter-server coordinator (its copy of the variables is current
    only after an epoch's join), one clear
    error before anything runs, naming the chief-aware alternatives."""
    orbax_checkpoint = getattr(keras.callbacks, "OrbaxCheckpoint", None)
    if orbax_checkpoint is None or not isinstance(callbacks, (list, tuple)):
        return
    found = [c for c in callbacks if isinstance(c, orbax_checkpoint)]
    if not found:
        return
    from keras_dist._hooks import _ps_fit

    extended = strategy.extended
    if _ps_fit.is_parameter_server(strategy):
        where = ("a ParameterServerStrategy (steps run asynchronously on the workers; the coordinator's copy of "
                 "the variables is current only after each epoch's join)")
    elif extended.num_workers > 1:
        where = (
            f"a {type(strategy).__name__} job of {extended.num_workers} processes (each would write its own "
            f"checkpoint into {getattr(found[0], 'directory', 'the same directory')!r}: a torn checkpoint)"
        )
    else:
        return
    raise ValueError(
        f"{method} got keras.callbacks.OrbaxCheckpoint under {where}. keras_dist supports OrbaxCheckpoint where "
        "the job is one process. Here use keras.callbacks.BackupAndRestore (to resume a job: the chief commits "
        "weights, optimizer and epoch together) or keras.callbacks.ModelCheckpoint (the chief writes your path)."
    )


def check_backup_dirs_writable(callbacks) -> None:
    """The chief's `BackupAndRestore` directories must be writable; checked
    before training starts, so nothing runs (or is half-written) first."""
    for callback in callbacks if isinstance(callbacks, (list, tuple)) else ():
        if not isinstance(callback, keras.callbacks.BackupAndRestore):
            continue
        directory = str(callback.backup_dir)
        if "://" in directory:
            continue  # a remote filesystem: Keras' own I/O reports errors
        try:
            os.makedirs(directory, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=directory, prefix=".keras_dist_write_check"):
                pass
        except OSError as error:
            raise ValueError(
                f"BackupAndRestore cannot write its backup to {directory!r} "
                f"({error.strerror or error}). Give it a directory this process "
                "can write (backup_dir=...)."
            ) from error
