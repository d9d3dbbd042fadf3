"""The signature each hooked Keras function has in every supported Keras
(3.10, 3.15 and 3.16 measured), as `inspect.signature` writes it. `patch()`
checks the installed Keras' against it, so a Keras release that changes a
hooked function's arguments fails at import naming the hook, not mid-`fit`.
A new Keras is taken on by running `tests/test_hooks.py` under it: the
test prints any signature to add here (after reading the change)."""

#: target -> {signature: the Keras versions measured with it}
SIGNATURES = {
    'keras.src.backend.common.variables:Variable.__float__': {
        '(self)': '3.10, 3.15, 3.16',
    },
    'keras.src.backend.common.variables:Variable.__int__': {
        '(self)': '3.10, 3.15, 3.16',
    },
    'keras.src.backend.common.variables:Variable.assign': {
        '(self, value)': '3.10, 3.15, 3.16',
    },
    'keras.src.backend.common.variables:Variable.assign_add': {
        '(self, value)': '3.10, 3.15, 3.16',
    },
    'keras.src.backend.common.variables:Variable.assign_sub': {
        '(self, value)': '3.10, 3.15, 3.16',
    },
    'keras.src.backend.jax.distribution_lib:distribute_tensor': {
        '(tensor, layout)': '3.10, 3.15, 3.16',
    },
    'keras.src.backend.jax.trainer:JAXTrainer.compute_loss_and_updates': {
        '(self, trainable_variables, non_trainable_variables, metrics_variables, x, y, sample_weight, training=False, optimizer_variables=None)': '3.10, 3.15, 3.16',
    },
    'keras.src.backend.jax.trainer:_distribute_data': {
        '(data, layouts=None)': '3.10, 3.15',
        '(data, layouts=None, is_super_batch=False)': '3.16',
    },
    'keras.src.backend.tensorflow.nn:conv': {
        "(inputs, kernel, strides=1, padding='valid', data_format=None, dilation_rate=1)": '3.10, 3.15, 3.16',
    },
    'keras.src.backend.tensorflow.nn:depthwise_conv': {
        "(inputs, kernel, strides=1, padding='valid', data_format=None, dilation_rate=1)": '3.10, 3.15, 3.16',
    },
    'keras.src.backend.tensorflow.nn:separable_conv': {
        "(inputs, depthwise_kernel, pointwise_kernel, strides=1, padding='valid', data_format=None, dilation_rate=1)": '3.10, 3.15, 3.16',
    },
    'keras.src.backend.tensorflow.numpy:add': {
        '(x1, x2)': '3.10, 3.15, 3.16',
    },
    'keras.src.backend.tensorflow.optimizer:TFOptimizer._all_reduce_sum_gradients': {
        '(self, grads_and_vars)': '3.10, 3.15, 3.16',
    },
    'keras.src.backend.tensorflow.random:dropout': {
        '(inputs, rate, noise_shape=None, seed=None)': '3.10, 3.15, 3.16',
    },
    'keras.src.backend.tensorflow.trainer:TensorFlowTrainer._maybe_symbolic_build': {
        '(self, iterator=None, data_batch=None)': '3.10, 3.15, 3.16',
    },
    'keras.src.backend.torch.core:Variable._initialize': {
        '(self, value)': '3.10, 3.15, 3.16',
    },
    'keras.src.backend.torch.random:dropout': {
        '(inputs, rate, noise_shape=None, seed=None)': '3.10, 3.15, 3.16',
    },
    'keras.src.backend:gru': {
        '(*args, **kwargs)': '3.10',
        '(inputs, initial_state, mask, kernel, recurrent_kernel, bias, activation, recurrent_activation, return_sequences=False, go_backwards=False, unroll=False, reset_after=True)': '3.15, 3.16',
    },
    'keras.src.backend:rnn': {
        '(step_function, inputs, initial_states, go_backwards=False, mask=None, constants=None, unroll=False, input_length=None, time_major=False, zero_output_for_mask=False, return_all_outputs=True)': '3.10, 3.15, 3.16',
    },
    'keras.src.callbacks.backup_and_restore:BackupAndRestore._load_model': {
        '(self)': '3.10, 3.15, 3.16',
    },
    'keras.src.callbacks.backup_and_restore:BackupAndRestore._save_model': {
        '(self)': '3.10, 3.15, 3.16',
    },
    'keras.src.layers.layer:Layer.get_weights': {
        '(self)': '3.10, 3.15, 3.16',
    },
    'keras.src.layers.layer:Layer.set_weights': {
        '(self, weights)': '3.10, 3.15, 3.16',
    },
    'keras.src.layers.layer:Layer.trainable_variables': {
        '(self)': '3.10, 3.15, 3.16',
    },
    'keras.src.layers.layer:Layer.weights': {
        '(self)': '3.10, 3.15, 3.16',
    },
    'keras.src.layers.normalization.batch_normalization:BatchNormalization.__init__': {
        "(self, axis=-1, momentum=0.99, epsilon=0.001, center=True, scale=True, beta_initializer='zeros', gamma_initializer='ones', moving_mean_initializer='zeros', moving_variance_initializer='ones', beta_regularizer=None, gamma_regularizer=None, beta_constraint=None, gamma_constraint=None, renorm=False, renorm_clipping=None, renorm_momentum=0.99, synchronized=False, **kwargs)": '3.15, 3.16',
        "(self, axis=-1, momentum=0.99, epsilon=0.001, center=True, scale=True, beta_initializer='zeros', gamma_initializer='ones', moving_mean_initializer='zeros', moving_variance_initializer='ones', beta_regularizer=None, gamma_regularizer=None, beta_constraint=None, gamma_constraint=None, synchronized=False, **kwargs)": '3.10',
    },
    'keras.src.layers.normalization.batch_normalization:BatchNormalization._moments': {
        '(self, inputs, mask)': '3.10, 3.15, 3.16',
    },
    'keras.src.layers.rnn.rnn:RNN.call': {
        '(self, sequences, initial_state=None, mask=None, training=False)': '3.10, 3.15, 3.16',
    },
    'keras.src.losses.loss:Loss.__call__': {
        '(self, y_true, y_pred, sample_weight=None)': '3.10, 3.15, 3.16',
    },
    'keras.src.losses.loss:reduce_values': {
        "(values, sample_weight=None, reduction='sum_over_batch_size')": '3.10, 3.15, 3.16',
    },
    'keras.src.losses.loss:scale_loss_for_distribution': {
        '(value)': '3.10, 3.15, 3.16',
    },
    'keras.src.losses.loss:unscale_loss_for_distribution': {
        '(value)': '3.10, 3.15, 3.16',
    },
    'keras.src.metrics.metric:Metric.__init__': {
        '(self, dtype=None, name=None)': '3.10, 3.15, 3.16',
    },
    'keras.src.metrics.metrics_utils:update_confusion_matrix_variables': {
        '(variables_to_update, y_true, y_pred, thresholds, top_k=None, class_id=None, sample_weight=None, multi_label=False, label_weights=None, thresholds_distributed_evenly=False)': '3.10, 3.15, 3.16',
    },
    'keras.src.metrics.reduction_metrics:reduce_to_samplewise_values': {
        '(values, sample_weight, reduce_fn, dtype)': '3.10, 3.15, 3.16',
    },
    'keras.src.models.model:Model.evaluate': {
        "(self, x=None, y=None, batch_size=None, verbose='auto', sample_weight=None, steps=None, callbacks=None, return_dict=False, **kwargs)": '3.10, 3.15, 3.16',
    },
    'keras.src.models.model:Model.fit': {
        "(self, x=None, y=None, batch_size=None, epochs=1, verbose='auto', callbacks=None, validation_split=0.0, validation_data=None, shuffle=True, class_weight=None, sample_weight=None, initial_epoch=0, steps_per_epoch=None, validation_steps=None, validation_batch_size=None, validation_freq=1)": '3.10, 3.15, 3.16',
    },
    'keras.src.models.model:Model.predict': {
        "(self, x, batch_size=None, verbose='auto', steps=None, callbacks=None)": '3.10, 3.15, 3.16',
    },
    'keras.src.models.model:Model.predict_on_batch': {
        '(self, x)': '3.10, 3.15, 3.16',
    },
    'keras.src.models.model:Model.save': {
        '(self, filepath, overwrite=True, zipped=None, **kwargs)': '3.10, 3.15, 3.16',
    },
    'keras.src.models.model:Model.save_weights': {
        '(self, filepath, overwrite=True, max_shard_size=None)': '3.10, 3.15, 3.16',
    },
    'keras.src.models.model:Model.test_on_batch': {
        '(self, x, y=None, sample_weight=None, return_dict=False)': '3.10, 3.15, 3.16',
    },
    'keras.src.models.model:Model.train_on_batch': {
        '(self, x, y=None, sample_weight=None, class_weight=None, return_dict=False)': '3.10, 3.15, 3.16',
    },
    'keras.src.optimizers.base_optimizer:BaseOptimizer.apply': {
        '(self, grads, trainable_variables=None)': '3.10, 3.15, 3.16',
    },
    'keras.src.optimizers.loss_scale_optimizer:LossScaleOptimizer.apply': {
        '(self, grads, trainable_variables=None)': '3.10, 3.15, 3.16',
    },
    'keras.src.trainers.trainer:Trainer.__init__': {
        '(self)': '3.10, 3.15, 3.16',
    },
    'keras.src.trainers.trainer:Trainer._aggregate_additional_loss': {
        '(self, loss)': '3.10, 3.15, 3.16',
    },
    'keras.src.trainers.trainer:Trainer.compile': {
        "(self, optimizer='rmsprop', loss=None, loss_weights=None, metrics=None, weighted_metrics=None, run_eagerly=False, steps_per_execution=1, jit_compile='auto', auto_scale_loss=True)": '3.10, 3.15, 3.16',
    },
}
