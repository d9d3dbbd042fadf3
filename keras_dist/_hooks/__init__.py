"""Every contact between keras_dist and Keras' trainer internals.

Each hook wraps one Keras function or method. A wrapper first asks whether
the model (or the running step) belongs to a keras_dist strategy; if not it
calls the original unchanged, so code outside a strategy behaves exactly as
plain Keras. When a Keras upgrade moves one of these names, `install()`
fails here, loudly, naming it. `HOOKS` below is the one list: `install()`,
this docstring's table and the hooks test all read it. The modules, by
concern: `_patching` (mechanics), `_entry` (scope and entry checks),
`_optimizers` (`compile` adopts an unused optimizer made outside the
scope), `_files` (checkpoints, chief-only files), `_losses` (loss scaling,
BatchNorm moments), `_random` (one device's dropout masks in replica steps), `_steps` (the distributed steps, from the backend
adapter), `_run_variables` (increments written inside `run`), `_metrics`
(metrics inside `run` skip JAX's padding rows),
`_variables` (variables agree across workers; a variable split over the ps
tasks is trained as its shards), `_loops` (recurrent layers inside `run`; stateful ones split over replicas),
`_empty_replicas` (replicas a global batch leaves without rows), `_distributed_input`
(`fit` of a distributed dataset: its global batches), `_ps_fit` (fit under
ParameterServerStrategy, entered from `_entry`'s fit). Nothing here imports jax or tensorflow.

Hooks:
{table}
"""

from __future__ import annotations

from typing import Optional

from keras_dist._hooks import _seams
from keras_dist._hooks import _empty_replicas, _entry, _files, _losses, _loops, _metrics, _random, _run_variables, _steps, _variables
from keras_dist._context import model_strategy
from keras_dist._keras_names import current, keras_version
from keras_dist._hooks._patching import ORIGINALS, Hook, patch, resolve
from keras_dist._shard import scale_factor, unscale_factor
from keras_dist.backends import backend_name

__all__ = ["HOOKS", "ORIGINALS", "Hook", "current", "hooks_for", "install", "model_strategy", "resolve"]

_TRAINER = "keras.src.trainers.trainer:Trainer"
_MODEL = "keras.src.models.model:Model"
_LOSS = "keras.src.losses"
_JAX_TRAINER = "keras.src.backend.jax.trainer"
_TF_TRAINER = "keras.src.backend.tensorflow.trainer:TensorFlowTrainer"
_JAX, _TF, _TORCH = ("jax",), ("tensorflow",), ("torch",)

HOOKS: tuple = (
    # scope and entry checks
    Hook(
        f"{_TRAINER}.__init__",
        _entry.wrap_trainer_init,
        purpose="remember the strategy in scope; give the model its own make_{train,test,predict}_function "
        "(the adapter's step: Keras' public seam, per instance)",
    ),
    Hook(
        f"{_TRAINER}.compile",
        _entry.wrap_compile,
        purpose="compile under the model's strategy, adopting an unused optimizer made "
        "outside the scope (on Trainer: Keras skips compile_from_config when `compile` is overridden)",
    ),
    *(
        Hook(f"{_MODEL}.{name}", _entry.wrap_entry(name), purpose="check, then run in the model's scope")
        for name in _entry.ENTRY_POINTS
    ),
    # checkpoints and chief-only files
    *(
        Hook(f"{_MODEL}.{kind}", _files.wrap_chief_only_write(kind),
             purpose="non-chief workers write a private temp file; the chief's is written whole, then renamed")
        for kind in ("save", "save_weights")
    ),
    Hook(f"{_files.BACKUP}._save_model", _files.wrap_backup_save, purpose="atomic backups; non-chief: private dir"),
    Hook(f"{_files.BACKUP}._load_model", _files.wrap_backup_load, purpose="the epoch committed with the weights"),
    # loss scaling and BatchNorm moments
    Hook(f"{_LOSS}.loss:Loss.__call__", _losses.wrap_loss_call, purpose="refuse per-replica averaging in run()"),
    Hook(
        f"{_LOSS}.loss:reduce_values",
        _losses.wrap_reduce_values,
        purpose="replica step: a self-averaged scalar loss scaled like the rest; no rows: zero",
    ),
    Hook(
        f"{_LOSS}.loss:scale_loss_for_distribution",
        _losses.wrap_scale(scale_factor),
        purpose="replica step: scale by this replica's share of the global batch",
    ),
    Hook(
        f"{_LOSS}.loss:unscale_loss_for_distribution",
        _losses.wrap_scale(unscale_factor),
        purpose="replica step: undo that scaling for the logged loss",
    ),
    Hook(
        "keras.src.layers.normalization.batch_normalization:BatchNormalization.__init__",
        _losses.wrap_batch_norm_init,
        _JAX,
        purpose="take synchronized=True under a strategy (keras_dist synchronizes every BatchNorm there)",
    ),
    Hook(
        "keras.src.layers.normalization.batch_normalization:BatchNormalization._moments",
        _losses.wrap_moments,
        purpose="replica step: moments of the global batch",
    ),
    Hook(
        "keras.src.backend.tensorflow.random:dropout",
        _random.wrap_dropout,
        _TF,
        purpose="replica step: this replica's rows of one device's dropout mask over the global batch",
    ),
    Hook(
        "keras.src.backend.torch.random:dropout",
        _random.wrap_dropout,
        _TORCH,
        purpose="replica step: this replica's rows of one device's dropout mask over the global batch",
    ),
    Hook(
        f"{_TRAINER}._aggregate_additional_loss",
        _losses.wrap_additional_loss,
        _JAX + _TORCH,
        purpose="replica step: scale regularization like the loss",
    ),
    Hook(
        f"{_JAX_TRAINER}:JAXTrainer.compute_loss_and_updates",
        _losses.wrap_compute_loss_and_updates,
        _JAX,
        purpose="replica step: sum gradients over replicas, packed",
    ),
    # variables written inside run
    *(
        Hook(
            f"keras.src.backend.common.variables:Variable.{name}",
            _run_variables.wrap_assign_delta(sign),
            purpose="run(): the increment aggregates across replicas, as in tf; on a ps: atomic",
        )
        for name, sign in (("assign_add", 1), ("assign_sub", -1))
    ),
    Hook(
        "keras.src.backend.common.variables:Variable.assign",
        _run_variables.wrap_assign,
        _TF,
        purpose="a ps variable written in a scheduled function: once, even when re-run",
    ),
    *(
        Hook(
            f"keras.src.backend.common.variables:Variable.__{convert.__name__}__",
            _variables.wrap_scalar_conversion(convert),
            _TF,
            purpose=f"{convert.__name__}(variable) of a variable tf holds distributed (tf's classes have no "
            f"__{convert.__name__}__)",
        )
        for convert in (int, float)
    ),
    Hook(
        "keras.src.metrics.reduction_metrics:reduce_to_samplewise_values",
        _metrics.wrap_reduce_to_samplewise_values,
        _JAX,
        purpose="run(): Mean/Sum-based metrics skip the rows padding an uneven shard",
    ),
    Hook(
        "keras.src.metrics.metric:Metric.__init__",
        _metrics.wrap_metric_init,
        _JAX + _TF,  # torch: a metric's writes inside run() are all-reduced (assign_add), so every replica reads it whole
        purpose="run(): metric.result() is the value over all replicas, as in tf-keras",
    ),
    Hook(
        "keras.src.metrics.metrics_utils:update_confusion_matrix_variables",
        _metrics.wrap_update_confusion_matrix_variables,
        _JAX,
        purpose="run(): confusion-matrix metrics (AUC, ...) skip the padding rows",
    ),
    Hook(
        "keras.src.backend:rnn",
        _loops.wrap_rnn,
        _JAX,
        purpose="run(): an RNN's initial state varies across replicas as its state does (LSTM, GRU, SimpleRNN)",
    ),
    Hook(
        "keras.src.backend:gru",
        _loops.wrap_gru,
        _JAX,
        purpose="run(): the same for the backend's own GRU loop",
    ),
    Hook(
        "keras.src.layers.rnn.rnn:RNN.call",
        _loops.wrap_rnn_layer_call,
        purpose="a stateful RNN in a step that splits the global batch over replicas: one clear error",
    ),
    Hook(
        "keras.src.backend.tensorflow.numpy:add",
        _empty_replicas.wrap_add,
        _TF,
        purpose="a replica with 0 rows: Keras' bias_add shortcut took a (0, n) operand for a bias (fixed in Keras 3.16)",
        below=(3, 16),
    ),
    *(
        Hook(
            f"keras.src.backend.tensorflow.nn:{name}",
            _empty_replicas.wrap_convolution,
            _TF,
            purpose="a replica with 0 rows: tf's oneDNN convolution gave an empty batch the input's channels",
        )
        for name in ("conv", "depthwise_conv", "separable_conv")
    ),
    # variables agree across workers
    Hook(
        "keras.src.backend.jax.distribution_lib:distribute_tensor",
        _variables.wrap_distribute_tensor,
        _JAX,
        purpose="multi-process: values placed on the mesh are the chief's; each placed exactly as its layout says",
    ),
    Hook(
        "keras.src.backend.torch.core:Variable._initialize",
        _variables.wrap_initialize,
        _TORCH,
        purpose="multi-process: a new variable's initial value is the chief's",
    ),
    *(
        Hook(
            f"keras.src.layers.layer:Layer.{name}",
            _variables.wrap_variable_list,
            _TF,
            purpose="parameter servers: a variable split over the ps tasks is listed and trained as its shards",
        )
        for name in ("weights", "trainable_variables")
    ),
    *(
        Hook(
            f"keras.src.layers.layer:Layer.{name}",
            _variables.wrap_whole_variables,
            _TF,
            purpose="parameter servers: get_weights/set_weights see a split variable whole",
        )
        for name in ("get_weights", "set_weights")
    ),
    # the distributed steps
    Hook(f"{_JAX_TRAINER}:_distribute_data", _steps.wrap_distribute_data, _JAX, purpose="leave batches to the step"),
    Hook(
        "keras.src.optimizers.base_optimizer:BaseOptimizer.apply",
        _steps.wrap_optimizer_apply,
        purpose="refuse cross-replica context; sum gradients over replicas before clipping; TF: build slots outside replicas in run(); a ps update in a scheduled function: once",
    ),
    Hook(
        "keras.src.optimizers.loss_scale_optimizer:LossScaleOptimizer.apply",
        _steps.wrap_loss_scale_apply,
        _TF,
        purpose="sum the gradients over replicas before the finite check and the inner optimizer",
    ),
    Hook(
        "keras.src.backend.tensorflow.optimizer:TFOptimizer._all_reduce_sum_gradients",
        _steps.wrap_all_reduce_sum_gradients,
        _TF,
        purpose="gradients summed before clipping pass through (not summed twice)",
    ),
    Hook(
        f"{_TF_TRAINER}._maybe_symbolic_build",
        _steps.wrap_maybe_symbolic_build,
        _TF,
        purpose="skip when all is built, else build from the input's spec (no extra batch per fit), or the input is empty",
    ),
)

__doc__ = __doc__.format(
    table="\n".join(
        f"  {hook.target}  [{', '.join(hook.backends)}]"
        + (f" (Keras < {'.'.join(map(str, hook.below))})" if hook.below else "")
        + f"\n      {hook.purpose}"
        + f"\n      no public seam: {_seams.reason(hook.target)}"
        for hook in HOOKS
    )
)

_installed = False


def hooks_for(backend: str, version: Optional[tuple] = None) -> list:
    """The hooks installed on `backend` under the installed Keras (or `version`)."""
    version = version or keras_version()
    return [hook for hook in HOOKS if backend in hook.backends and (hook.below is None or version < hook.below)]


def install() -> None:
    """Installs the hooks for the current backend (idempotent)."""
    global _installed
    if _installed:
        return
    import keras

    _steps.check_step_function_makers(keras.Model)
    for hook in hooks_for(backend_name()):
        patch(hook)
    _installed = True
