"""`keras-dist bench`: train a built-in model and print its ScalingReport.

```
keras-dist bench --replicas 4 --backend jax --batch-size 256 --steps 50 --plot scaling.png
keras-dist bench --replicas 2 --backend torch
```

The command line parses and checks the options, then trains in a child
Python process (`python -m keras_dist._bench ...`) with ``KERAS_BACKEND``
set, so that the backend and the simulated CPU devices are chosen before
the backend starts. By default the child splits the host CPU into
``--replicas`` devices (`keras_dist.simulate_cpu_devices`); with
``--no-simulate`` it takes the first ``--replicas`` local devices as they
are (GPUs, for instance).

On torch a replica is a process (torch.distributed): with ``--replicas N``
above 1, a one-replica child runs first and measures the reference, then
``keras-dist launch -n N`` runs N children under
``MultiWorkerMirroredStrategy``, and the chief prints the report with the
speedup against that reference.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from collections.abc import Sequence

BACKENDS = ("jax", "tensorflow", "torch")
MODELS = ("mlp", "cnn")
STRATEGIES = ("mirrored", "one_device", "none")
CROSS_DEVICE_OPS = ("default", "nccl", "hierarchical", "one_device")
_PREFIX = "keras-dist bench: "
_TIMEOUT_EXIT_CODE = 124


def _int_at_least(minimum: int):
    """An argparse type: an integer of at least `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def parser(prog: str = "keras-dist bench") -> argparse.ArgumentParser:
    """The options of `keras-dist bench`."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Train a small built-in model under a keras_dist strategy and print "
        "its ScalingReport: where the step time goes (input, compute, cross-replica "
        "communication, host overhead), throughput, and efficiency against one replica.",
        epilog="Example: keras-dist bench --replicas 4 --backend jax --plot scaling.png",
    )
    p.add_argument("--replicas", "-n", type=_positive_int, default=2, metavar="N",
                   help="number of replicas (default: 2)")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="Keras backend (default: $KERAS_BACKEND, else the one installed; jax if both are)")
    p.add_argument("--model", choices=MODELS, default="mlp",
                   help="mlp: 784-512-512-10 dense; cnn: two conv layers with BatchNorm (default: mlp)")
    p.add_argument("--batch-size", type=_positive_int, default=256, metavar="B",
                   help="global batch size, split across the replicas (default: 256)")
    p.add_argument("--steps", type=_positive_int, default=30, metavar="S",
                   help="timed training steps; one more is run first, for compilation (default: 30)")
    p.add_argument("--strategy", choices=STRATEGIES, default="mirrored",
                   help="mirrored (default); one_device or none (plain Keras) need --replicas 1")
    p.add_argument("--cross-device-ops", choices=CROSS_DEVICE_OPS, default="default",
                   help="MirroredStrategy's cross_device_ops: default (None), nccl (NcclAllReduce), "
                   "hierarchical (HierarchicalCopyAllReduce), one_device (ReductionToOneDevice)")
    p.add_argument("--num-packs", type=_non_negative_int, default=1, metavar="K",
                   help="num_packs for nccl / hierarchical (default: 1)")
    p.add_argument("--plot", default=None, metavar="PATH", help="write the report's plot to PATH (PNG)")
    p.add_argument("--no-reference", dest="reference", action="store_false",
                   help="do not measure a one-replica reference (no speedup or efficiency)")
    p.add_argument("--no-simulate", dest="simulate", action="store_false",
                   help="use the first N local devices as they are instead of N simulated CPU devices")
    p.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                   help="stop the run after SECONDS and exit 124 (default: 600)")
    # torch's children: the launched job takes the one-replica child's throughput
    p.add_argument("--reference-samples-per-second", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--write-samples-per-second", default=None, help=argparse.SUPPRESS)
    return p


def _check(options, p: argparse.ArgumentParser) -> None:
    if options.strategy != "mirrored" and options.replicas != 1:
        p.error(f"--strategy {options.strategy} runs one replica; use --replicas 1 (got {options.replicas})")
    if options.strategy != "mirrored" and options.cross_device_ops != "default":
        p.error("--cross-device-ops needs --strategy mirrored")
    if not options.timeout > 0:
        p.error(f"--timeout must be > 0, got {options.timeout}")


def _check_torch(options, p: argparse.ArgumentParser) -> None:
    """torch's replicas are processes: no simulated devices, and tf's
    cross-device ops are TensorFlow's (torch.distributed reduces)."""
    if options.cross_device_ops != "default":
        p.error("--cross-device-ops is TensorFlow's; on torch, torch.distributed reduces the gradients")
    if not options.simulate:
        p.error("--no-simulate: on torch each replica is a process (keras-dist launch), never a simulated device")


def _child_argv(options) -> list[str]:
    argv = [
        "--replicas", str(options.replicas), "--model", options.model,
        "--batch-size", str(options.batch_size), "--steps", str(options.steps),
        "--strategy", options.strategy, "--cross-device-ops", options.cross_device_ops,
        "--num-packs", str(options.num_packs), "--timeout", str(options.timeout),
    ]
    if options.plot:
        argv += ["--plot", os.path.abspath(options.plot)]
    if not options.reference:
        argv.append("--no-reference")
    if not options.simulate:
        argv.append("--no-simulate")
    return argv


def _installed_backend() -> str:
    """jax if installed, else tensorflow if installed (a TensorFlow-only
    install), else jax (whose import then names what is missing)."""
    for backend in BACKENDS:
        if importlib.util.find_spec(backend) is not None:
            return backend
    return BACKENDS[0]


def main(argv: Sequence[str] | None = None) -> int:
    """`keras-dist bench ...`; returns the exit code.

    >>> main(["--replicas", "4", "--backend", "jax", "--steps", "20"])  # doctest: +SKIP
    0
    """
    p = parser()
    try:
        options = p.parse_args(list(sys.argv[1:] if argv is None else argv))
        _check(options, p)
    except SystemExit as exit_:  # argparse: --help (0) or a usage error (2)
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    backend = options.backend or os.environ.get("KERAS_BACKEND") or _installed_backend()
    if backend not in BACKENDS:
        p.print_usage(sys.stderr)
        print(f"{_PREFIX}error: KERAS_BACKEND={backend!r} is not one of {', '.join(BACKENDS)}; "
              "pass --backend", file=sys.stderr)
        return 2
    if backend == "torch":
        try:
            _check_torch(options, p)
        except SystemExit as exit_:
            return exit_.code if isinstance(exit_.code, int) else 2
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONUNBUFFERED="1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.basename(package_root) not in ("site-packages", "dist-packages"):
        # a source checkout: the child imports this same keras_dist
        env["PYTHONPATH"] = os.pathsep.join(p for p in [package_root, env.get("PYTHONPATH")] if p)
    if backend == "torch" and options.replicas > 1:
        return _torch_job(options, env)
    command = [sys.executable, "-m", "keras_dist._bench", *_child_argv(options)]
    try:
        return subprocess.run(command, env=env, timeout=options.timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"{_PREFIX}stopped after {options.timeout:g} s (--timeout)", file=sys.stderr)
        return _TIMEOUT_EXIT_CODE


def _torch_job(options, env) -> int:
    """torch, N > 1 replicas: the one-replica reference in a child of its
    own (unless --no-reference), then N launched processes."""
    import tempfile
    import time

    deadline = time.monotonic() + options.timeout
    argv = _child_argv(options)
    if options.reference:
        with tempfile.TemporaryDirectory(prefix="keras-dist-bench-") as directory:
            path = os.path.join(directory, "reference")
            per_replica = -(-options.batch_size // options.replicas)  # the report's reference batch
            one = _child_argv(argparse.Namespace(
                **{**vars(options), "replicas": 1, "batch_size": per_replica, "plot": None, "reference": True}
            ))
            print(f"{_PREFIX}measuring the one-replica reference (one process)", flush=True)
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "keras_dist._bench", *one, "--write-samples-per-second", path],
                    env=env, timeout=options.timeout, stdout=subprocess.DEVNULL,
                )
            except subprocess.TimeoutExpired:
                print(f"{_PREFIX}stopped after {options.timeout:g} s (--timeout)", file=sys.stderr)
                return _TIMEOUT_EXIT_CODE
            if done.returncode != 0:
                return done.returncode
            with open(path) as f:
                argv += ["--reference-samples-per-second", f.read().strip()]
    left = deadline - time.monotonic()
    if left <= 1:
        print(f"{_PREFIX}stopped after {options.timeout:g} s (--timeout)", file=sys.stderr)
        return _TIMEOUT_EXIT_CODE
    command = [
        sys.executable, "-m", "keras_dist.launch", "-n", str(options.replicas), "--backend", "torch",
        "--max-time", f"{left:.0f}", os.path.abspath(__file__), *argv,
    ]
    return subprocess.run(command, env=env).returncode


# -- the child process ------------------------------------------------------


def _build(name: str):
    import keras

    keras.utils.set_random_seed(0)
    if name == "mlp":
        layers = [
            keras.Input((784,)),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(10),
        ]
    else:
        layers = [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    model = keras.Sequential(layers, name=f"bench_{name}")
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _data(name: str, rows: int):
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (rows, 784) if name == "mlp" else (rows, 28, 28, 1)
    return rng.random(shape, dtype=np.float32), rng.integers(0, 10, size=rows)


def _cross_device_ops(options):
    import keras_dist

    if options.cross_device_ops == "nccl":
        return keras_dist.NcclAllReduce(num_packs=options.num_packs)
    if options.cross_device_ops == "hierarchical":
        return keras_dist.HierarchicalCopyAllReduce(num_packs=options.num_packs)
    if options.cross_device_ops == "one_device":
        return keras_dist.ReductionToOneDevice()
    return None


def _strategy(options):
    import keras

    import keras_dist
    from keras_dist import _devices
    from keras_dist.backends import get_adapter

    if options.strategy == "none":
        return None
    if keras.config.backend() == "torch" and options.replicas > 1:  # one process of a launched job
        return keras_dist.MultiWorkerMirroredStrategy()
    available = _devices.resolve_devices(None, get_adapter().visible_devices())
    if len(available) < options.replicas:
        raise ValueError(
            f"{options.replicas} replicas asked for, but this process sees "
            f"{len(available)} device(s) {list(available)}; use --replicas "
            f"{len(available)}, or leave out --no-simulate to simulate CPU devices"
        )
    if options.strategy == "one_device":
        return keras_dist.OneDeviceStrategy(available[0])
    return keras_dist.MirroredStrategy(
        list(available[: options.replicas]), cross_device_ops=_cross_device_ops(options)
    )


def _child(argv: Sequence[str]) -> int:
    options = parser("python -m keras_dist._bench").parse_args(list(argv))
    import keras

    import keras_dist

    if options.simulate and keras.config.backend() != "torch":
        keras_dist.simulate_cpu_devices(options.replicas)  # before any computation
    try:
        strategy = _strategy(options)
        report = keras_dist.callbacks.ScalingReport(
            plot_path=options.plot,
            measure_reference=options.reference,
            reference_samples_per_second=options.reference_samples_per_second,
        )
    except (ValueError, TypeError, ImportError) as error:
        print(f"{_PREFIX}error: {error}", file=sys.stderr)
        return 2
    if keras.config.backend() == "torch":
        where = "processes" if options.replicas > 1 else "one process"
    else:
        where = "simulated CPU devices" if options.simulate else "local devices"
    print(
        f"{_PREFIX}{options.model}, {options.replicas} replica(s) ({where}, "
        f"strategy {options.strategy}) on {keras.config.backend()}, global batch "
        f"{options.batch_size}, {options.steps} timed steps",
        flush=True,
    )
    rows = options.batch_size * (options.steps + 1)
    x, y = _data(options.model, rows)
    if strategy is None:
        model = _build(options.model)
    else:
        with strategy.scope():
            model = _build(options.model)
    model.fit(x, y, batch_size=options.batch_size, epochs=1, shuffle=False, verbose=0, callbacks=[report])
    if options.write_samples_per_second:
        with open(options.write_samples_per_second, "w") as f:
            f.write(repr(report.result.samples_per_second))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
