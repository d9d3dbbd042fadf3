"""`make test`'s processes: Keras' own imports of scikit-learn and matplotlib
are refused (ImportError, which Keras expects for optional packages).

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
"""

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
