"""One process of the torch benchmark (benchmarks/torch_ddp.py); the chief
prints one JSON line.

Usage: python benchmarks/_torch_worker.py MODE PER_WORKER_BATCH STEPS REPEATS [HIDDEN]
HIDDEN: the MLP's two hidden widths (784-HIDDEN-HIDDEN-10; default 512).
MODE: "keras" (plain Keras on torch, no strategy; one process only),
"keras_dist" (MultiWorkerMirroredStrategy over the job's processes), "ddp"
(the same MLP hand-written in torch.nn under DistributedDataParallel, the
path a torch user would pick). The job comes from TF_CONFIG and
KERAS_DIST_COORDINATOR (none: one process). Same model, data, optimizer
(SGD 0.01) and global batch (PER_WORKER_BATCH x processes) in every mode.
"""

import json
import os
import statistics
import sys
import time

mode, per_worker, steps, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
hidden = int(sys.argv[5]) if len(sys.argv) > 5 else 512
os.environ["KERAS_BACKEND"] = "torch"

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # one core per process (the launcher pins each)
config = json.loads(os.environ.get("TF_CONFIG") or "{}")
workers = len(config.get("cluster", {}).get("worker", [])) or 1
rank = config.get("task", {}).get("index", 0)
global_batch = per_worker * workers
rng = np.random.default_rng(0)  # the same data on every process
x = rng.normal(size=(global_batch * steps, 784)).astype("float32")
y = rng.integers(0, 10, size=(global_batch * steps,))


def epochs_ddp():
    import torch.distributed as dist

    if workers > 1:
        import atexit

        host, port = os.environ["KERAS_DIST_COORDINATOR"].rsplit(":", 1)
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank, world_size=workers)
        atexit.register(dist.destroy_process_group)  # as keras_dist ends its group
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )
    if workers > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        for step in range(steps):  # this process's rows of each global batch
            rows = slice(step * global_batch + rank * per_worker, step * global_batch + (rank + 1) * per_worker)
            optimizer.zero_grad()
            loss_fn(model(xs[rows]), ys[rows]).backward()  # DDP averages the gradients over the processes
            optimizer.step()
        times.append(time.perf_counter() - start)
    return times[1:]


def epochs_keras(distributed):
    import keras

    import keras_dist

    strategy = keras_dist.MultiWorkerMirroredStrategy() if distributed else keras_dist.get_strategy()
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((784,)), keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class Timer(keras.callbacks.Callback):
        epochs = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append(time.perf_counter() - self.start)

    model.fit(x, y, batch_size=global_batch, epochs=repeats + 1, shuffle=False, verbose=0, callbacks=[Timer()])
    return Timer.epochs[1:]


if mode == "ddp":
    epochs = epochs_ddp()
elif mode in ("keras", "keras_dist"):
    if mode == "keras" and workers > 1:
        sys.exit("plain Keras runs one process")
    epochs = epochs_keras(mode == "keras_dist")
else:
    sys.exit(f"unknown mode {mode!r}")
seconds = statistics.median(epochs)
if rank == 0:
    print(json.dumps({
        "mode": mode, "workers": workers, "per_worker_batch": per_worker, "steps": steps, "hidden": hidden,
        "step_ms": 1000 * seconds / steps, "samples_per_second": global_batch * steps / seconds,
        "torch": torch.__version__,
    }), flush=True)
if mode == "ddp":
    # The anchor's own teardown: with DDP, torch 2.13 + gloo abort 1 process in 12-16 at
    # interpreter exit even after destroy_process_group (pytorch#190489; keras_dist's
    # workers: 0 in 24). The step times are measured; the exit is skipped.
    sys.stdout.flush()
    os._exit(0)
