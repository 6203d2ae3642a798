#!/usr/bin/python3
"""Writes a .keras archive of recurrent layers in Keras 3's layout, and what it holds.

Keras 3 (keras/src/saving/saving_lib.py, `_save_state` and `_walk_saveable`) saves a layer's own
variables under `layers/<key>/vars` and then walks its tracked sublayers in `dir()` order, each
under its attribute's name: an RNN layer owns no variables (an empty `vars` group, named after the
layer) and its `cell` holds them (`layers/lstm/cell/vars/0..2`, named `lstm_cell`);
`Bidirectional` walks `backward_layer` and `forward_layer`, each an RNN layer with its `cell`.
`H5IOStore.make` writes the `name` attribute of each `vars` group.

    /usr/bin/python3 tests/keras/generate_recurrent_keras3.py

writes tests/keras/reference/recurrent_keras3.keras (config.json, metadata.json,
model.weights.h5) and tests/keras/reference/recurrent_keras3.json: the `vars` groups with their
`name` attributes, and the weights in the order of Keras's `model.weights` (forward direction
before backward) with the dataset each comes from.
"""

import io
import json
import os
import zipfile

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DTYPE = {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"},
         "registered_name": None}


def initializer(name, **config):
    return {"module": "keras.initializers", "class_name": name,
            "config": {"seed": None, **config} if name != "Zeros" else {},
            "registered_name": None}


def rnn_config(class_name, name, units, **options):
    """Keras 3's get_config() of SimpleRNN, LSTM or GRU (keras/src/layers/rnn/*.py)."""
    config = {"name": name, "trainable": True, "dtype": DTYPE,
              "return_sequences": options.get("return_sequences", False),
              "return_state": False, "go_backwards": options.get("go_backwards", False),
              "stateful": False, "unroll": False, "zero_output_for_mask": False,
              "units": units, "activation": "tanh"}
    if class_name != "SimpleRNN":
        config["recurrent_activation"] = "sigmoid"
    config.update(use_bias=True, kernel_initializer=initializer("GlorotUniform"),
                  recurrent_initializer=initializer("Orthogonal", gain=1.0),
                  bias_initializer=initializer("Zeros"))
    if class_name == "LSTM":
        config["unit_forget_bias"] = True
    config.update(kernel_regularizer=None, recurrent_regularizer=None, bias_regularizer=None,
                  activity_regularizer=None, kernel_constraint=None, recurrent_constraint=None,
                  bias_constraint=None, dropout=0.0, recurrent_dropout=0.0)
    if class_name == "GRU":
        config["reset_after"] = True
    config["seed"] = None
    return config


def entry(class_name, config, input_shape):
    return {"module": "keras.layers", "class_name": class_name, "config": config,
            "registered_name": None, "build_config": {"input_shape": input_shape}}


def cell_shapes(class_name, features, units):
    gates = {"SimpleRNN": 1, "LSTM": 4, "GRU": 3}[class_name]
    bias = (2, gates * units) if class_name == "GRU" else (gates * units,)
    return [(features, gates * units), (units, gates * units), bias]


def main():
    rng = np.random.default_rng(33)
    steps, features = 4, 3
    # input (4, 3) -> LSTM(4, sequences) -> Bidirectional(GRU(2, sequences)) -> SimpleRNN(2)
    lstm = rnn_config("LSTM", "lstm", 4, return_sequences=True)
    forward = rnn_config("GRU", "forward_gru", 2, return_sequences=True)
    backward = rnn_config("GRU", "backward_gru", 2, return_sequences=True, go_backwards=True)
    both = {"name": "bidirectional", "trainable": True, "dtype": DTYPE, "merge_mode": "concat",
            "layer": {"module": "keras.layers", "class_name": "GRU", "config": forward,
                      "registered_name": None,
                      "build_config": {"input_shape": [None, steps, 4]}},
            "backward_layer": {"module": "keras.layers", "class_name": "GRU", "config": backward,
                               "registered_name": None,
                               "build_config": {"input_shape": [None, steps, 4]}}}
    simple = rnn_config("SimpleRNN", "simple_rnn", 2)
    layers = [entry("LSTM", lstm, [None, steps, features]),
              entry("Bidirectional", both, [None, steps, 4]),
              entry("SimpleRNN", simple, [None, steps, 4])]
    batch_shape = [None, steps, features]
    config = {"module": "keras", "class_name": "Sequential",
              "config": {"name": "sequential", "trainable": True, "dtype": DTYPE,
                         "layers": [{"module": "keras.layers", "class_name": "InputLayer",
                                     "config": {"batch_shape": batch_shape, "dtype": "float32",
                                                "sparse": False, "name": "input_layer"},
                                     "registered_name": None}] + layers,
                         "build_input_shape": batch_shape},
              "registered_name": None, "build_config": {"input_shape": batch_shape}}

    def values(shapes):
        return [rng.uniform(-0.5, 0.5, shape).astype("<f4") for shape in shapes]

    lstm_weights = values(cell_shapes("LSTM", features, 4))
    forward_weights = values(cell_shapes("GRU", 4, 2))
    backward_weights = values(cell_shapes("GRU", 4, 2))
    simple_weights = values(cell_shapes("SimpleRNN", 4, 2))
    # (group below the root, its name attribute, its datasets)
    groups = [("vars", "sequential", []),
              ("layers/lstm/vars", "lstm", []),
              ("layers/lstm/cell/vars", "lstm_cell", lstm_weights),
              ("layers/bidirectional/vars", "bidirectional", []),
              ("layers/bidirectional/backward_layer/vars", "backward_gru", []),
              ("layers/bidirectional/backward_layer/cell/vars", "gru_cell", backward_weights),
              ("layers/bidirectional/forward_layer/vars", "forward_gru", []),
              ("layers/bidirectional/forward_layer/cell/vars", "gru_cell", forward_weights),
              ("layers/simple_rnn/vars", "simple_rnn", []),
              ("layers/simple_rnn/cell/vars", "simple_rnn_cell", simple_weights)]
    image = io.BytesIO()
    with h5py.File(image, "w") as f:
        for path, name, arrays in groups:
            group = f.create_group(path)
            group.attrs["name"] = name
            for i, value in enumerate(arrays):
                group.create_dataset(str(i), data=value, track_times=False)
    # Keras's model.weights: layer by layer, Bidirectional's forward layer before its backward.
    ordered = [("layers/lstm/cell/vars", lstm_weights),
               ("layers/bidirectional/forward_layer/cell/vars", forward_weights),
               ("layers/bidirectional/backward_layer/cell/vars", backward_weights),
               ("layers/simple_rnn/cell/vars", simple_weights)]
    weights = [{"dataset": f"{path}/{i}", "shape": list(value.shape),
                "values": [float(v) for v in value.reshape(-1)]}
               for path, arrays in ordered for i, value in enumerate(arrays)]
    reference = os.path.join(HERE, "reference")
    with zipfile.ZipFile(os.path.join(reference, "recurrent_keras3.keras"), "w") as z:
        for name, data in [("metadata.json", json.dumps({"keras_version": "3.5.0",
                                                         "date_saved": "2024-09-01@12:00:00"})),
                           ("config.json", json.dumps(config)),
                           ("model.weights.h5", image.getvalue())]:
            z.writestr(zipfile.ZipInfo(name, date_time=(2024, 9, 1, 12, 0, 0)), data)
    with open(os.path.join(reference, "recurrent_keras3.json"), "w") as out:
        json.dump({"generator": "tests/keras/generate_recurrent_keras3.py",
                   "groups": [{"path": path, "name": name, "size": len(arrays)}
                              for path, name, arrays in groups],
                   "weights": weights}, out, indent=1)
        out.write("\n")


if __name__ == "__main__":
    main()
