"""The equivalence contract on an accelerator (a GPU run; never a CI need).

Trains tests/test_equivalence.py's cases with plain Keras on the first
accelerator and a copy of the same weights under keras_dist strategies on
that accelerator (`OneDeviceStrategy`, `MirroredStrategy` over it), on the
same global batches, and prints one JSON line per case with the largest
weight difference, the largest `evaluate` and `predict` differences, and
whether each is within the tests' tolerances (1e-5, 1e-6, 1e-5).

    KERAS_BACKEND=jax python benchmarks/accelerator_equivalence.py [--json FILE]

Exit status 1 if a case is outside the tolerances or no accelerator is
visible. Matrix products in float32 run at "highest" precision (JAX's
default lets a GPU use TF32, which by itself differs from float32 by ~1e-3).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_dist  # noqa: E402
from _helpers import make_data, max_weight_diff, twin  # noqa: E402
from _report import write_atomically  # noqa: E402

CASES = {
    "even-2000-64": (2000, 64, False),
    "partial-1003-64": (1003, 64, False),
    "batch10-partial": (203, 10, False),
    "batchnorm-1003-64": (1003, 64, True),
    "batchnorm-batch10": (203, 10, True),
}


def _accelerators() -> list[str]:
    from keras_dist.backends import get_adapter

    return [d for d in get_adapter().visible_devices() if not d.startswith("cpu:")]


def _log_diff(a: dict, b: dict) -> float:
    return max(abs(a[k] - b[k]) / max(1.0, abs(a[k])) for k in a)


def run_case(strategy_name: str, strategy, case: str, optimizer: str) -> dict:
    num_samples, batch_size, batch_norm = CASES[case]
    x, y = make_data(num_samples)
    reference, distributed = twin(strategy, optimizer=optimizer, batch_norm=batch_norm)
    reference.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
    distributed.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
    weights = max_weight_diff(reference, distributed)
    evaluate = _log_diff(
        reference.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True),
        distributed.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True),
    )
    predict = float(
        np.max(np.abs(reference.predict(x, batch_size=batch_size, verbose=0) - distributed.predict(x, batch_size=batch_size, verbose=0)))
    )
    return {
        "backend": keras.config.backend(),
        "strategy": strategy_name,
        "case": case,
        "optimizer": optimizer,
        "max_weight_diff": weights,
        "max_evaluate_diff": evaluate,
        "max_predict_diff": predict,
        "ok": weights <= 1e-5 and evaluate <= 1e-6 and predict <= 1e-5,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here")
    parser.add_argument("--device", help='the device to compare on (default: the first accelerator; "cpu:0" for a dry run)')
    args = parser.parse_args()
    if keras.config.backend() == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")
    else:
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(False)
    devices = [args.device] if args.device else _accelerators()
    if not devices:
        print("no accelerator is visible to this backend", file=sys.stderr)
        return 1
    device = devices[0]
    strategies = {
        f"OneDeviceStrategy({device})": lambda: keras_dist.OneDeviceStrategy(device),
        f"MirroredStrategy([{device}])": lambda: keras_dist.MirroredStrategy([device]),
    }
    results = []
    for name, make in strategies.items():
        for case in CASES:
            for optimizer in ("sgd", "adam"):
                result = run_case(name, make(), case, optimizer)
                print(json.dumps(result), flush=True)
                results.append(result)
    if args.json:
        write_atomically(args.json, json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
