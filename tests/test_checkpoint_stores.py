"""keras_dist._checkpoint_stores: how PreemptionCheckpointHandler's
checkpoints are written and found (unit tests; test_preemption.py runs them
through the handler and real jobs)."""

import os

import pytest

from keras_dist._checkpoint_stores import store_for


class _Saver:
    """An object with save(path)/restore(path): a file, or a directory."""

    def __init__(self, as_directory=False, writes=True):
        self.as_directory, self.writes, self.restored = as_directory, writes, None

    def save(self, path, text="state"):
        if not self.writes:
            return
        if self.as_directory:
            os.makedirs(path)
            path = os.path.join(path, "data")
        with open(path, "w") as handle:
            handle.write(text)

    def restore(self, path):
        self.restored = path


@pytest.mark.parametrize("as_directory", [False, True], ids=["file", "directory"])
def test_each_save_commits_by_rename_and_leaves_only_the_newest(tmp_path, as_directory):
    store = store_for(_Saver(as_directory))
    store.open(tmp_path)
    (tmp_path / f".ckpt-3.tmp-{os.getpid() + 1}").write_text("a write killed midway")
    assert store.latest() is None
    store.save(3, None, (), {"text": "three"})
    store.save(5, None, (), {})
    store.save(5, None, (), {})  # the same run count again (restored, then stopped before a run)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-5"]
    assert store.latest() == (5, "ckpt-5")
    store.restore("ckpt-5")
    assert store.value.restored == os.path.join(tmp_path, "ckpt-5")


def test_a_directory_set_aside_for_one_of_the_same_run_count_is_the_fallback(tmp_path):
    """Killed between moving the old `ckpt-5` aside and renaming the new
    one into place: the aside copy is what `latest` finds."""
    store = store_for(_Saver(as_directory=True))
    store.open(tmp_path)
    os.makedirs(tmp_path / ".ckpt-5.tmp-123-replaced")
    assert store.latest() == (5, ".ckpt-5.tmp-123-replaced")


def test_a_save_that_writes_nothing_at_the_path_is_an_error(tmp_path):
    store = store_for(_Saver(writes=False))
    store.open(tmp_path)
    with pytest.raises(RuntimeError, match="wrote nothing at that path"):
        store.save(1, None, (), {})
    assert os.listdir(tmp_path) == []


def test_a_non_chief_saves_into_its_own_directory(tmp_path):
    store = store_for(_Saver())
    store.open(tmp_path / "shared")
    where = store.save(2, str(tmp_path / "private"), (), {})
    assert where == str(tmp_path / "private" / "ckpt-2") and not (tmp_path / "shared").exists()


def test_what_cannot_be_checkpointed_and_a_missing_directory_are_clear_errors(tmp_path):
    with pytest.raises(TypeError, match="a Keras model .*, an object with save\\(path\\) and restore\\(path\\)"):
        store_for(object())
    with pytest.raises(ValueError, match="give checkpoint_dir"):
        store_for(_Saver()).open(None)
