"""`fit`, `evaluate` and `predict` of a keras_dist distributed dataset.

tf.keras trained on the result of `strategy.experimental_distribute_dataset`
or `distribute_datasets_from_function`; Keras 3 refuses keras_dist's own
(`Unrecognized data type`). Under the strategy that made it (the default strategy: a model made outside any scope), the call gets
its global batches instead, through a Keras `DataAdapter` (Keras takes one
as input as it is): a fresh pass each epoch, as tf.data's datasets give.
A step's global batch is the one the dataset splits (for a dataset from a
function, its replicas' batches joined in replica order), so training is
one device's on those batches. A `tf.data` dataset each worker reads its
own stream of (AutoShardPolicy FILE, OFF or HINT) is handed over as that
dataset, whose worker streams `fit` builds itself.

Keras' contact point is the `DataAdapter` base class
(`keras.src.trainers.data_adapters.data_adapter`), tested in
`tests/test_inputs.py`.
"""

from __future__ import annotations

from typing import Any

from keras.src.trainers.data_adapters import data_adapter as _keras_data_adapter

from keras_dist._input import DistributedDataset

#: The arguments of each entry point that take input data.
_DATA_ARGUMENTS = {"fit": ("x", "validation_data"), "evaluate": ("x",), "predict": ("x",)}


class DistributedDatasetAdapter(_keras_data_adapter.DataAdapter):
    """Keras' view of a keras_dist distributed dataset: its global batches."""

    def __init__(self, dataset: DistributedDataset):
        self._dataset = dataset

    def get_numpy_iterator(self):
        return self._dataset.global_batches()

    get_jax_iterator = get_numpy_iterator

    def get_tf_dataset(self):
        from keras_dist import _tf_data

        return _tf_data.dataset_of_batches(self._dataset.global_batches, self._dataset.element_spec)

    def get_torch_dataloader(self):
        raise NotImplementedError("keras_dist does not support the torch backend yet.")

    @property
    def num_batches(self):
        # None where the source does not say: each epoch runs to the end
        # of the data (Keras then warns once, as for any generator)
        return self._dataset.num_global_batches

    @property
    def batch_size(self):
        return None

    @property
    def has_partial_batch(self):
        return None

    @property
    def partial_batch_size(self):
        return None


def _is_keras_dist_own(value: Any) -> bool:
    """A distributed dataset a keras_dist strategy made: its own class, or
    the engine's own (TensorFlow's, for tf.data input) marked by the strategy."""
    return hasattr(value, "_keras_dist_trains_as")


def replace_distributed_datasets(name: str, signature, strategy, model, args, kwargs) -> tuple:
    """`args, kwargs` of `Model.<name>` with each keras_dist distributed
    dataset replaced by what Keras can train on; one clear error, before
    anything runs, for one made by another strategy or given with `y` or
    `sample_weight`."""
    arguments = _DATA_ARGUMENTS.get(name, ())
    if not any(_is_keras_dist_own(value) for value in (*args, *kwargs.values())):
        return args, kwargs
    try:
        bound = signature.bind(model, *args, **kwargs)
    except TypeError:
        return args, kwargs  # let Keras report the bad call
    for argument in arguments:
        value = bound.arguments.get(argument)
        if not _is_keras_dist_own(value):
            continue
        what = f"{name}'s {argument}"
        owner, make_source = value._keras_dist_trains_as
        if owner is not strategy:
            made_by = "the default strategy (no scope)" if owner is None else repr(owner)
            belongs = "was made outside any strategy's scope" if strategy is None else f"belongs to {strategy!r}"
            raise ValueError(
                f"{what} is a distributed dataset made by {made_by}, but the model "
                f"{belongs}. Its replicas' shards would not be this "
                "strategy's: distribute the dataset with the model's own strategy, "
                "or pass the undistributed dataset."
            )
        if argument == "x":
            for extra in ("y", "sample_weight"):
                if bound.arguments.get(extra) is not None:
                    raise ValueError(
                        f"{name} got a distributed dataset as x and a `{extra}`: a "
                        "dataset's elements carry the targets (and weights); put "
                        f"`{extra}` into the dataset and leave the argument out."
                    )
        source = make_source()
        bound.arguments[argument] = DistributedDatasetAdapter(source) if isinstance(source, DistributedDataset) else source
    return bound.args[1:], bound.kwargs
