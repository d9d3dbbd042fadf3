"""Why each hook is a hook: the one-line reason no public Keras seam serves
(Keras 3.10-3.16). A hook target's reason is the entry of its longest
matching prefix; tests/test_hooks.py checks every hook has one.

    >>> reason("keras.src.models.model:Model.fit")[:40]
    'Keras has no public callback that runs b'
"""

from __future__ import annotations


#: target prefix -> why no public seam serves it
NO_PUBLIC_SEAM = {
    "keras.src.trainers.trainer:Trainer.__init__": (
        "Keras has no public hook at model construction, where the strategy in scope is recorded (and the "
        "model given its own make_*_function, Keras' public seam for the step functions)"),
    "keras.src.trainers.trainer:Trainer.compile": (
        "compile has no public callback; an optimizer made outside the scope is adopted here"),
    "keras.src.models.model:Model.": (
        "Keras has no public callback that runs before fit/evaluate/predict/save can change state: "
        "the model's scope and the cross-worker checks must come first"),
    "keras.src.callbacks.backup_and_restore:BackupAndRestore.": (
        "the user's own BackupAndRestore instances must write atomically and once per job; its "
        "write and read are private methods of the public callback"),
    "keras.src.losses.loss:": (
        "Keras' loss reduction and distribution scaling are module functions that know only "
        "the replica count, not each replica's share of an uneven global batch"),
    "keras.src.layers.normalization.batch_normalization:BatchNormalization.": (
        "synchronized=True is tf.distribute's on TensorFlow only; the moments are private"),
    "keras.src.backend.tensorflow.random:dropout": (
        "backend random functions take no replica slice of one device's mask"),
    "keras.src.backend.torch.random:dropout": (
        "backend random functions take no replica slice of one device's mask"),
    "keras.src.trainers.trainer:Trainer._aggregate_additional_loss": (
        "the regularization losses are summed privately, without the replica's share"),
    "keras.src.backend.jax.trainer:JAXTrainer.compute_loss_and_updates": (
        "Keras' JAX gradient computation has no seam for a cross-replica sum"),
    "keras.src.backend.common.variables:Variable.__": (
        "int()/float() of a Keras variable convert the backend's value directly, and tf's distributed "
        "variables have no __int__/__float__"),
    "keras.src.backend.common.variables:Variable.": (
        "Keras variables have no aggregation for writes inside run (tf.Variable's aggregation)"),
    "keras.src.metrics.": (
        "metrics take no row mask for the rows that pad an uneven shard, and no cross-replica result"),
    "keras.src.backend:": "the backend's recurrent loops take no replica information",
    "keras.src.layers.rnn.rnn:RNN.call": "a stateful RNN's state per replica has no public check",
    "keras.src.backend.tensorflow.numpy:add": (
        "a Keras 3.10-3.15 shortcut took a (0, n) operand for a bias (fixed in 3.16, where it is not installed)"),
    "keras.src.backend.tensorflow.nn:": (
        "TensorFlow's CPU convolutions mishandle an empty batch (oneDNN: wrong channels; "
        "without it: uninitialised filter gradients)"),
    "keras.src.backend.jax.distribution_lib:distribute_tensor": (
        "keras.distribution places a value without checking the workers agree on it"),
    "keras.src.backend.torch.core:Variable._initialize": (
        "torch variables have no public seam where a new value can be taken from the chief"),
    "keras.src.layers.layer:Layer.": (
        "Keras has no variable partitioning: tf's sharded variables are listed by shard here"),
    "keras.src.backend.jax.trainer:_distribute_data": (
        "Keras' JAX epoch iterator puts each whole batch on the default device (or keras.distribution's "
        "layout) privately, before the step; keras_dist's step places each replica's rows itself"),
    "keras.src.optimizers.": (
        "optimizers have no public seam for gradients summed over replicas before clipping and the finite check"),
    "keras.src.backend.tensorflow.optimizer:TFOptimizer._all_reduce_sum_gradients": (
        "Keras' TF optimizer sums gradients itself under tf.distribute; already summed ones must pass"),
    "keras.src.backend.tensorflow.trainer:TensorFlowTrainer._maybe_symbolic_build": (
        "Keras' TF trainer builds from a batch it draws privately (one extra batch per fit)"),
}


def reason(target: str) -> str:
    """Why `target` is hooked (its longest matching prefix's entry); KeyError if none."""
    for prefix in sorted(NO_PUBLIC_SEAM, key=len, reverse=True):
        if target.startswith(prefix):
            return NO_PUBLIC_SEAM[prefix]
    raise KeyError(f"no reason recorded for the hook on {target}")
