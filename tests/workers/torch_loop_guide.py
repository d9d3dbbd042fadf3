"""keras-io's guide "Writing a training loop from scratch in PyTorch"
(guides/writing_a_custom_training_loop_in_torch.py, keras-team/keras-io at
2faba87a9), its loop with a Keras optimizer, loss and metrics, ported to a
keras_dist strategy as tf.distribute's custom-training tutorial ports a
loop: what the guide runs per batch is the function given to
`strategy.run`. Run under `keras-dist launch -n 2 --backend torch`
(MultiWorkerMirroredStrategy); `guide(strategy)` is also called in one
process by tests/test_torch_backend.py under the other strategies.

argv: OUT_DIR. Each worker writes OUT_DIR/worker<i>.json: the guide's
losses, accuracies and weights under the strategy and under the default
strategy (one device, the same global batches).

Changes beyond wrapping the step in `strategy.run`, each what a
tf.distribute user does:
- the model, optimizer and metrics are made in `strategy.scope()`;
- the loss is `reduction="none"`, averaged over the global batch by
  `keras_dist.compute_average_loss` (the guide's loss averages its own
  batch, which under several replicas is the replica's share);
- the DataLoaders are distributed (`experimental_distribute_dataset`), and
  the logged loss is `strategy.reduce("SUM", ...)` of the replicas' losses;
- the validation loop is a `strategy.run` too (the guide's runs the model
  on the whole batch outside any replica);
- MNIST is a synthetic stand-in of the same shapes, 600 training and 200
  validation rows (no download; 600 / 32 leaves a partial last batch),
  2 epochs instead of 3, and `torch.manual_seed(0)` before each run so the
  DataLoader's shuffle is the same for the one-device twin;
- the losses, accuracies and weights are recorded, not printed.
"""

import json
import os
import sys

import numpy as np
import torch
import keras

import keras_dist

batch_size = 32
epochs = 2


def get_model():
    inputs = keras.Input(shape=(784,), name="digits")
    x1 = keras.layers.Dense(64, activation="relu")(inputs)
    x2 = keras.layers.Dense(64, activation="relu")(x1)
    outputs = keras.layers.Dense(10, name="predictions")(x2)
    model = keras.Model(inputs=inputs, outputs=outputs)
    return model


def mnist_like():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, size=(800, 784)).astype("float32")
    labels = (x[:, :10].argmax(axis=1) + (x[:, 10] > 0.5)) % 10  # learnable from the pixels
    y = keras.utils.to_categorical(labels, 10).astype("float32")
    return (x[:600], y[:600]), (x[600:], y[600:])


def guide(strategy):
    (x_train, y_train), (x_val, y_val) = mnist_like()
    train_dataset = torch.utils.data.TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    val_dataset = torch.utils.data.TensorDataset(torch.from_numpy(x_val), torch.from_numpy(y_val))
    train_dataloader = torch.utils.data.DataLoader(train_dataset, batch_size=batch_size, shuffle=True)
    val_dataloader = torch.utils.data.DataLoader(val_dataset, batch_size=batch_size, shuffle=False)

    torch.manual_seed(0)
    keras.utils.set_random_seed(1)
    with strategy.scope():
        # Get a fresh model
        model = get_model()
        # Instantiate an optimizer to train the model.
        optimizer = keras.optimizers.Adam(learning_rate=1e-3)
        # Prepare the metrics.
        train_acc_metric = keras.metrics.CategoricalAccuracy()
        val_acc_metric = keras.metrics.CategoricalAccuracy()
    # Instantiate a loss function.
    loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True, reduction="none")

    def train_step(inputs, targets):
        # Forward pass
        logits = model(inputs)
        loss = keras_dist.compute_average_loss(loss_fn(targets, logits))

        # Backward pass
        model.zero_grad()
        trainable_weights = [v for v in model.trainable_weights]

        # Call torch.Tensor.backward() on the loss to compute gradients
        # for the weights.
        loss.backward()
        gradients = [v.value.grad for v in trainable_weights]

        # Update weights
        with torch.no_grad():
            optimizer.apply(gradients, trainable_weights)

        # Update training metric.
        train_acc_metric.update_state(targets, logits)
        return loss

    def val_step(x_batch_val, y_batch_val):
        val_logits = model(x_batch_val, training=False)
        # Update val metrics
        val_acc_metric.update_state(y_batch_val, val_logits)

    record = {"losses": [], "train_acc": [], "val_acc": []}
    for epoch in range(epochs):
        for step, (inputs, targets) in enumerate(strategy.experimental_distribute_dataset(train_dataloader)):
            loss = strategy.reduce("SUM", strategy.run(train_step, args=(inputs, targets)), axis=None)
            record["losses"].append(float(loss.detach()))

        # Display metrics at the end of each epoch.
        train_acc = train_acc_metric.result()
        record["train_acc"].append(float(train_acc))
        # Reset training metrics at the end of each epoch
        train_acc_metric.reset_state()

        # Run a validation loop at the end of each epoch.
        for x_batch_val, y_batch_val in strategy.experimental_distribute_dataset(val_dataloader):
            strategy.run(val_step, args=(x_batch_val, y_batch_val))
        val_acc = val_acc_metric.result()
        val_acc_metric.reset_state()
        record["val_acc"].append(float(val_acc))
    record["weights"] = [w.tolist() for w in model.get_weights()]
    record["iterations"] = int(keras.ops.convert_to_numpy(optimizer.iterations))
    return record


if __name__ == "__main__":
    out_dir = sys.argv[1]
    strategy = keras_dist.MultiWorkerMirroredStrategy(
        communication_options=keras_dist.CommunicationOptions(timeout_seconds=60)
    )
    distributed = guide(strategy)
    one_device = guide(keras_dist.get_strategy())
    result = {
        "replicas": strategy.num_replicas_in_sync,
        "distributed": distributed,
        "one_device": one_device,
    }
    os.makedirs(out_dir, exist_ok=True)
    index = strategy.cluster_resolver.task_id
    path = os.path.join(out_dir, f"worker{index}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(result, handle)
    os.replace(path + ".tmp", path)
