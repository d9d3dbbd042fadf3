"""`make test`'s processes: Keras' own imports of scikit-learn and matplotlib
are refused (ImportError, which Keras expects for optional packages), and,
where KERAS_DIST_TEST_TF_GRAPPLER=off, TensorFlow's graph optimizer is off.

Python imports this module at start-up in every process whose PYTHONPATH
holds this folder: the Makefile puts it there for `make test` and `make
test-quick`, so the pytest processes and every process their tests start
(workers, examples, guides, launched jobs) inherit it.

Why: Keras imports both eagerly when they are installed (`keras.wrappers`
imports sklearn, and with it scipy.stats; `keras.visualization` imports
matplotlib.pyplot), and the test extra installs them for the examples'
digits data and ScalingReport's plot. Measured on this machine:
`import keras, keras_dist` costs 5.2 CPU-s on TensorFlow and 3.0 on JAX
with them, 3.4 and 1.5 without; `make test` starts hundreds of such
processes. A user's `pip install ".[jax]"` or `".[tensorflow]"` has neither
package, so this is the environment keras_dist's users have.

What still sees them: any other importer (an example's `from
sklearn.datasets import load_digits`, ScalingReport's matplotlib) imports
them as usual; only modules named `keras.*` are refused, so Keras' scikit-
learn wrappers and `plot_image_gallery` say the package is missing in these
processes (no test uses them). The targets that run as users' machines do
(`make test-keras-min`, `-zoo`, `-faults`, `-stress`, `make demo`) do not
put this folder on PYTHONPATH.

TensorFlow's graph optimizer (grappler: constant folding, op fusion,
layout and arithmetic rewrites) runs on every tf.function each time it is
instantiated, and a test instantiates hundreds of small ones. With
KERAS_DIST_TEST_TF_GRAPPLER=off (set by `make test` and `make test-quick`),
every process that imports tensorflow turns it off at once
(`tf.config.optimizer.set_experimental_options({"disable_meta_optimizer":
True})`). Measured side by side, twice: TensorFlow's test_equivalence and
test_custom_loops 134 -> 125 CPU-s (-7%). As with JAX's -O0 (Makefile, JAX_TEST_COMPILE), a test
compares a distributed run with one device in the same setting, and the
targets above run TensorFlow's defaults.
"""

import os
import sys

_REFUSED_FOR_KERAS = frozenset({"sklearn", "matplotlib"})


class _KerasOptionalImports:
    """A meta-path finder that refuses `_REFUSED_FOR_KERAS` to Keras' modules."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] not in _REFUSED_FOR_KERAS:
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib")):
            frame = frame.f_back
        importer = "" if frame is None else frame.f_globals.get("__name__", "")
        if importer == "keras" or importer.startswith("keras."):
            raise ModuleNotFoundError(f"{name} is not imported by Keras in make test's processes (tests/startup)", name=name)
        return None


sys.meta_path.insert(0, _KerasOptionalImports())


class _TensorFlowWithoutGrappler:
    """A meta-path finder that, once `tensorflow` is imported, turns its graph
    optimizer off (the module docstring says why)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "tensorflow":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _OptimizerOffLoader(spec.loader)
        return spec


class _OptimizerOffLoader:
    """tensorflow's own loader, and then the optimizer turned off."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})

    def __getattr__(self, name):
        return getattr(self._loader, name)


if os.environ.get("KERAS_DIST_TEST_TF_GRAPPLER") == "off":
    sys.meta_path.insert(0, _TensorFlowWithoutGrappler())
