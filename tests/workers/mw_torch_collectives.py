"""A worker of the torch backend's collective-count job (issue #50): every
`torch.distributed` collective a `fit` step, an `evaluate` step and a
`predict` step make, counted by kind.

argv: OUT_DIR. Each of `fit`, `evaluate`, `predict` runs twice, over 4 and
then 8 batches of a global batch of 16 (an MLP with metrics, and the same
with BatchNormalization): a kind's count per step is the difference over
the 4 extra batches, so what a call makes once (its set-up, its epoch's
logs) is left out. Then count metrics (`TruePositives`), whose logs a
second sum over the processes would double, against one device's; the
gradient sum's paths; whether gloo's event loop yields the worker's one
core. Writes OUT_DIR/worker<i>.json.
"""

import collections
import json
import os
import sys

out_dir = sys.argv[1]

import numpy as np  # noqa: E402
import torch.distributed as dist  # noqa: E402
import keras  # noqa: E402

import keras_dist  # noqa: E402

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
               "broadcast_object_list", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "barrier",
               "gather", "scatter", "reduce", "send", "recv")
calls = collections.Counter()


#: Inside the SIGTERM agreement's exchange (keras_dist/_hooks/_sigterm.py):
#: about once a second of steps, so how many a call makes depends on the
#: machine's speed; counted apart.
agreeing = {"now": False}


def counting(name, function):
    def counted(*args, **kwargs):
        kind = "sigterm_agreement" if agreeing["now"] else name + ("_async" if kwargs.get("async_op") else "")
        calls[kind] += 1
        return function(*args, **kwargs)

    return counted


for name in COLLECTIVES:
    if hasattr(dist, name):
        setattr(dist, name, counting(name, getattr(dist, name)))

# Each worker on one core, as benchmarks/torch_ddp.py pins them: gloo's
# event loop then yields its core (keras_dist/backends/_gloo.py).
cores = sorted(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cores[json.loads(os.environ["TF_CONFIG"])["task"]["index"] % len(cores)]})
from keras_dist._hooks import _sigterm  # noqa: E402

_exchange = _sigterm._AgreeOnTermination._exchange


def exchange(self, step_micros):
    agreeing["now"] = True
    try:
        return _exchange(self, step_micros)
    finally:
        agreeing["now"] = False


_sigterm._AgreeOnTermination._exchange = exchange
strategy = keras_dist.MultiWorkerMirroredStrategy(
    communication_options=keras_dist.CommunicationOptions(timeout_seconds=60)
)
index = strategy.cluster_resolver.task_id
rng = np.random.RandomState(0)
x = rng.randn(128, 6).astype("float32")
y = (x @ rng.randn(6, 1)).astype("float32")


def make(batch_norm):
    keras.utils.set_random_seed(1)
    layers = [keras.Input((6,)), keras.layers.Dense(8, activation="tanh")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    model = keras.Sequential(layers + [keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae", keras.metrics.RootMeanSquaredError()])
    return model


def per_step(call):
    """The collectives `call(batches)` makes per batch beyond its fixed ones."""
    calls.clear()
    call(4)
    four = collections.Counter(calls)
    calls.clear()
    call(8)
    eight = collections.Counter(calls)
    return {
        name: (eight[name] - four[name]) / 4
        for name in sorted(set(four) | set(eight))
        if eight[name] != four[name] and name != "sigterm_agreement"
    }


report = {}
for name, batch_norm in (("mlp", False), ("batchnorm", True)):
    with strategy.scope():
        model = make(batch_norm)
    model.fit(x[:32], y[:32], batch_size=16, epochs=1, shuffle=False, verbose=0)  # built, steps made
    report[name] = {
        "fit": per_step(lambda n: model.fit(x[:16 * n], y[:16 * n], batch_size=16, epochs=1, shuffle=False, verbose=0)),
        "evaluate": per_step(lambda n: model.evaluate(x[:16 * n], y[:16 * n], batch_size=16, verbose=0)),
        "predict": per_step(lambda n: model.predict(x[:16 * n], batch_size=16, verbose=0)),
    }
# A count metric, which a second sum over the processes would double (a
# mean's ratio hides one): its logs against one device's, same weights.
labels = (y > 0).astype("float32")


def counting_model():
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1, activation="sigmoid")])
    counts = [keras.metrics.TruePositives(name="tp"), keras.metrics.FalseNegatives(name="fn")]
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="binary_crossentropy", metrics=counts)
    return model, counts


def read(counts):
    """The metrics' own results (a one-device model's logs would be summed
    over the processes by Keras 3.16 itself, torch.distributed being up)."""
    return {metric.name: [float(keras.ops.convert_to_numpy(metric.result()))] for metric in counts}


with strategy.scope():
    distributed, _ = counting_model()
plain, plain_counts = counting_model()
fit_logs = distributed.fit(x, labels, batch_size=16, epochs=1, shuffle=False, verbose=0).history
plain.fit(x, labels, batch_size=16, epochs=1, shuffle=False, verbose=0)
fit_reference = read(plain_counts)
evaluate_logs = distributed.evaluate(x, labels, batch_size=16, verbose=0, return_dict=True)
plain.evaluate(x, labels, batch_size=16, verbose=0)
report["counts"] = {"fit": [fit_logs, fit_reference], "evaluate": [evaluate_logs, read(plain_counts)]}
# The gradient sum's paths (keras_dist/backends/torch/_reducer.py), each
# against one device from the same weights: two buckets (two 1.4 MB
# kernels: DDP's 1 MiB first bucket closes after the second; the per-step
# count of asynchronous sums too); a train_step that calls backward twice before the apply (the
# buckets' sums are stale: the gradients are summed again); one that
# changes the gradients before the apply (not the parameters' .grad);
# Keras' gradient accumulation, and a LossScaleOptimizer with clipnorm
# (the scaled gradients summed, then unscaled and clipped), two buckets each.
import torch  # noqa: E402


class CustomStep(keras.Sequential):
    """A `train_step` of its own: `backwards` backward passes, then the
    gradients times `scale` to the optimizer."""

    backwards, scale = 1, 1.0

    def train_step(self, data):
        x, y = data
        y_pred = self(x, training=True)
        self.zero_grad()
        loss = self.compute_loss(x=x, y=y, y_pred=y_pred, training=True)
        for left in reversed(range(self.backwards)):
            loss.backward(retain_graph=left > 0)
        grads = [v.value.grad if self.scale == 1.0 else v.value.grad * self.scale for v in self.trainable_weights]
        with torch.no_grad():
            self.optimizer.apply(grads, self.trainable_weights)
        return {"loss": loss}


wide_x = rng.randn(64, 600).astype("float32")
wide_y = (wide_x[:, :1] * 0.5).astype("float32")


def reducer_case(kind):
    keras.utils.set_random_seed(3)
    if kind in ("two_buckets", "accumulated", "loss_scaled"):
        layers = [keras.Input((600,)), keras.layers.Dense(600, activation="tanh"),
                  keras.layers.Dense(600, activation="tanh"), keras.layers.Dense(1)]
        model = keras.Sequential(layers)
    else:
        layers = [keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
        model = CustomStep(layers)
        model.backwards, model.scale = (2, 1.0) if kind == "backward_twice" else (1, 0.5)
    optimizer = {
        "accumulated": lambda: keras.optimizers.SGD(0.05, gradient_accumulation_steps=2),
        "loss_scaled": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.05, clipnorm=0.5)),
    }.get(kind, lambda: keras.optimizers.SGD(0.05))()
    model.compile(optimizer=optimizer, loss="mse")
    return model


report["reducer"] = {}
for kind in ("two_buckets", "backward_twice", "halved_gradients", "accumulated", "loss_scaled"):
    data = (wide_x, wide_y) if kind in ("two_buckets", "accumulated", "loss_scaled") else (x[:64], y[:64])
    with strategy.scope():
        distributed = reducer_case(kind)
    plain = reducer_case(kind)
    plain.set_weights(distributed.get_weights())
    calls.clear()
    distributed.fit(*data, batch_size=16, epochs=1, shuffle=False, verbose=0)
    plain.fit(*data, batch_size=16, epochs=1, shuffle=False, verbose=0)
    report["reducer"][kind] = {
        "weights": max(float(np.max(np.abs(a - b))) for a, b in zip(distributed.get_weights(), plain.get_weights())),
        "async_sums_per_step": calls["all_reduce_async"] / 4,
    }
from keras_dist.backends import _gloo  # noqa: E402

report["gloo_event_loops_idle"] = [os.sched_getscheduler(t) == os.SCHED_IDLE for t in _gloo.gloo_event_loop_threads()]
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"worker{index}.json.tmp"), "w") as handle:
    json.dump(report, handle)
os.replace(os.path.join(out_dir, f"worker{index}.json.tmp"), os.path.join(out_dir, f"worker{index}.json"))
