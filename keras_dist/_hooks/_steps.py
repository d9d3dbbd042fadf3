"""The distributed steps Keras' trainers run, asked of the backend adapter.

`make_{train,test,predict}_function` (on each backend's trainer class) take
`adapter.make_trainer_function`; around them, on JAX, batches are left to
the step, which places them; on TensorFlow, optimizers build their slots
outside replica computation and a fully built model skips Keras' symbolic
build (which pulls a batch from a fresh input iterator on every `fit`).
"""

from __future__ import annotations

import keras

from keras_dist import _context
from keras_dist._hooks._patching import model_strategy
from keras_dist.backends import get_adapter


def wrap_make_function(kind: str):
    """Wrapper maker for `<Trainer>.make_{kind}_function`."""
    attribute = f"{kind}_function"

    def make(original):
        def make_function(self, force=False):
            strategy = model_strategy(self)
            if strategy is None:
                return original(self, force)
            if getattr(self, attribute) is not None and not force:
                return getattr(self, attribute)
            function = get_adapter().make_trainer_function(self, strategy, kind)
            if function is None:
                return original(self, force)
            setattr(self, attribute, function)
            return function

        return make_function

    return make


def wrap_distribute_data(original):
    """Batches pass through untouched under a strategy: its step places them."""

    def _distribute_data(data, layouts=None):
        if _context.current_strategy() is None:
            return original(data, layouts)
        return data

    return _distribute_data


def wrap_optimizer_apply(original):
    def apply(self, grads, trainable_variables=None):
        context = _context.replica_context()
        if (
            context is not None
            and not self.built
            and trainable_variables is not None
            and context.num_replicas_in_sync > 1
        ):
            variables = list(trainable_variables)

            def build():
                with keras.name_scope(self.name, caller=self):
                    self.build(variables)
                self.built = True

            get_adapter().build_outside_replicas(build)
        return original(self, grads, trainable_variables)

    return apply


def _fully_built(model) -> bool:
    """Whether Keras' symbolic build would find nothing left to build."""
    compiled = (model._compile_metrics, model._compile_loss, model.optimizer)
    return all(layer.built for layer in model._flatten_layers()) and all(
        part is None or part.built for part in compiled
    )


def wrap_maybe_symbolic_build(original):
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if model_strategy(self) is not None and _fully_built(self):
            return
        return original(self, iterator=iterator, data_batch=data_batch)

    return _maybe_symbolic_build
