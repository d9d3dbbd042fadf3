"""tf-keras's `tf_keras/distribute/keras_embedding_model_correctness_test.py`,
ported by renaming: embedding models (an `Embedding`, one followed by a
`TimeDistributed(Dense)`, and a siamese pair sharing one `Embedding`)
trained, evaluated and used for prediction under each strategy against the
same model without one, from NumPy arrays and from `tf.data` datasets, with
and without validation data.

Source: keras-team/tf-keras at dd0a7237b, with its base class from
`keras_correctness_test_base.py` (ported in `_correctness_base.py`, which
lists its changes). Changes here, all of them:
- `tf_keras` -> `keras`; tf's `combinations.generate(...)` ->
  `_correctness_base.parametrize` over the same combinations
  (`test_combinations_for_embedding_model`: every strategy but the default
  one; its graph-mode half dropped, Keras 3 has no graph mode;
  `multi_worker_mirrored_eager()` left out: README.md).
- The classes are named with a `Test` prefix so pytest collects them
  (`DistributionStrategyEmbeddingModelCorrectnessTest` ->
  `TestDistributionStrategyEmbeddingModelCorrectnessTest`, the same for the
  siamese one); `distribution` is the strategy's tf name, made into the
  keras_dist strategy at the start of each method.
- Each method runs a rotation of its combinations (5 of 20: each strategy
  once), all 20 with KERAS_DIST_PEER_FULL_MATRIX=1 (`_correctness_base.select`).
- `np.int32` as an `Input` dtype -> `"int32"`;
  `gradient_descent_keras.SGD(learning_rate=0.1)` (legacy) ->
  `keras.optimizers.SGD(learning_rate=0.1)`.

On TensorFlow an `Embedding`'s gradient is a `tf.IndexedSlices`, which the
replicas' all-reduce must sum as the one-device run does; on JAX a dense
scatter-add.
"""

import keras
import numpy as np
import pytest

import _combinations
import _correctness_base as keras_correctness_test_base

pytestmark = [pytest.mark.zoo, pytest.mark.needs_tensorflow]  # make test-zoo; tf.data input on JAX too
#: The zoo's sample: make test runs this case (tests/_suite_plugin.py), make test-zoo the rest.
ZOO_SAMPLE = 'test_embedding_model_correctness[mirrored_strategy_with_two_gpus-'

_COMBINATIONS = keras_correctness_test_base.test_combinations_for_embedding_model()
_select = keras_correctness_test_base.select


class TestDistributionStrategyEmbeddingModelCorrectnessTest(
    keras_correctness_test_base.TestDistributionStrategyEmbeddingModelCorrectnessBase
):
    def get_model(
        self,
        max_words=10,
        initial_weights=None,
        distribution=None,
        input_shapes=None,
    ):
        del input_shapes
        with keras_correctness_test_base.MaybeDistributionScope(distribution):
            word_ids = keras.layers.Input(shape=(max_words,), dtype="int32", name="words")
            word_embed = keras.layers.Embedding(input_dim=20, output_dim=10)(word_ids)
            if self.use_distributed_dense:
                word_embed = keras.layers.TimeDistributed(keras.layers.Dense(4))(word_embed)
            avg = keras.layers.GlobalAveragePooling1D()(word_embed)
            preds = keras.layers.Dense(2, activation="softmax")(avg)
            model = keras.Model(inputs=[word_ids], outputs=[preds])

            if initial_weights:
                model.set_weights(initial_weights)

            model.compile(
                optimizer=keras.optimizers.SGD(learning_rate=0.1),
                loss="sparse_categorical_crossentropy",
                metrics=["sparse_categorical_accuracy"],
            )
        return model

    @keras_correctness_test_base.parametrize(_select(_COMBINATIONS, 0))
    def test_embedding_model_correctness(self, distribution, use_numpy, use_validation_data):
        distribution = _combinations.strategy(distribution)
        self.use_distributed_dense = False
        self.run_correctness_test(distribution, use_numpy, use_validation_data)

    @keras_correctness_test_base.parametrize(_select(_COMBINATIONS, 1))
    def test_embedding_time_distributed_model_correctness(self, distribution, use_numpy, use_validation_data):
        distribution = _combinations.strategy(distribution)
        self.use_distributed_dense = True
        self.run_correctness_test(distribution, use_numpy, use_validation_data)


class TestDistributionStrategySiameseEmbeddingModelCorrectnessTest(
    keras_correctness_test_base.TestDistributionStrategyEmbeddingModelCorrectnessBase
):
    def get_model(
        self,
        max_words=10,
        initial_weights=None,
        distribution=None,
        input_shapes=None,
    ):
        del input_shapes
        with keras_correctness_test_base.MaybeDistributionScope(distribution):
            word_ids_a = keras.layers.Input(shape=(max_words,), dtype="int32", name="words_a")
            word_ids_b = keras.layers.Input(shape=(max_words,), dtype="int32", name="words_b")

            def submodel(embedding, word_ids):
                word_embed = embedding(word_ids)
                rep = keras.layers.GlobalAveragePooling1D()(word_embed)
                return keras.Model(inputs=[word_ids], outputs=[rep])

            word_embed = keras.layers.Embedding(
                input_dim=20,
                output_dim=10,
                input_length=max_words,
                embeddings_initializer=keras.initializers.RandomUniform(0, 1),
            )

            a_rep = submodel(word_embed, word_ids_a).outputs[0]
            b_rep = submodel(word_embed, word_ids_b).outputs[0]
            sim = keras.layers.Dot(axes=1, normalize=True)([a_rep, b_rep])

            model = keras.Model(inputs=[word_ids_a, word_ids_b], outputs=[sim])

            if initial_weights:
                model.set_weights(initial_weights)

            # TODO(b/130808953): Switch back to the V1 optimizer after
            # global_step is made mirrored.
            model.compile(
                optimizer=keras.optimizers.SGD(learning_rate=0.1),
                loss="mse",
                metrics=["mse"],
            )
        return model

    def get_data(
        self,
        count=(keras_correctness_test_base._GLOBAL_BATCH_SIZE * keras_correctness_test_base._EVAL_STEPS),
        min_words=5,
        max_words=10,
        max_word_id=19,
        num_classes=2,
    ):
        features_a, labels_a, _ = super().get_data(count, min_words, max_words, max_word_id, num_classes)

        features_b, labels_b, _ = super().get_data(count, min_words, max_words, max_word_id, num_classes)

        y_train = np.zeros((count, 1), dtype=np.float32)
        y_train[labels_a == labels_b] = 1.0
        y_train[labels_a != labels_b] = -1.0
        # TODO(b/123360757): Add tests for using list as inputs for multi-input
        # models.
        x_train = {
            "words_a": features_a,
            "words_b": features_b,
        }
        x_predict = x_train

        return x_train, y_train, x_predict

    @keras_correctness_test_base.parametrize(_select(_COMBINATIONS, 2))
    def test_siamese_embedding_model_correctness(self, distribution, use_numpy, use_validation_data):
        distribution = _combinations.strategy(distribution)
        self.run_correctness_test(distribution, use_numpy, use_validation_data)
