#!/usr/bin/python3
"""Writes models with a nested model in Keras's two file layouts, and their outputs in NumPy.

tf.keras 2 (tf-keras saving/legacy/hdf5_format.py, `save_weights_to_hdf5_group`): a nested model
is ONE entry of the root's `layer_names`; its group's `weight_names` are its layers' variables
("dense/kernel:0", no scope of the nested model), in `_legacy_weights` order: the trainable
weights of every inner layer, then the non-trainable ones (a BatchNormalization's moving
statistics come last). Its `model_config` entry is the inner model's own config under the class
name "Sequential" or "Functional".

Keras 3 (keras/src/saving/saving_lib.py, `_save_state`): the nested model's group holds its own
`vars` (empty) and its layers under `layers/<key>` as a model does:
`layers/functional/layers/dense/vars/0`; a functional model's InputLayer has an empty `vars`
group. Its config.json entry is the model's serialization: module "keras.src.models.functional",
class_name "Functional", registered_name "Functional", build_config.

    /usr/bin/python3 tests/keras/generate_nested_models.py

writes tests/keras/reference/nested_tfkeras2.h5, nested_keras3.keras and nested_models.json (the
inputs, the outputs computed here in NumPy, the weights in layer order, and the groups and
weight names each layout holds).
"""

import io
import json
import os
import zipfile

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DTYPE3 = {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"},
          "registered_name": None}


def glorot2():
    return {"class_name": "GlorotUniform", "config": {"seed": None}}


def zeros2():
    return {"class_name": "Zeros", "config": {}}


def dense2(name, units, activation):
    """tf.keras 2.13's Dense.get_config()."""
    return {"name": name, "trainable": True, "dtype": "float32", "units": units,
            "activation": activation, "use_bias": True, "kernel_initializer": glorot2(),
            "bias_initializer": zeros2(), "kernel_regularizer": None, "bias_regularizer": None,
            "activity_regularizer": None, "kernel_constraint": None, "bias_constraint": None}


def batch_norm2(name):
    return {"name": name, "trainable": True, "dtype": "float32", "axis": [1], "momentum": 0.99,
            "epsilon": 0.001, "center": True, "scale": True, "beta_initializer": zeros2(),
            "gamma_initializer": {"class_name": "Ones", "config": {}},
            "moving_mean_initializer": zeros2(),
            "moving_variance_initializer": {"class_name": "Ones", "config": {}},
            "beta_regularizer": None, "gamma_regularizer": None, "beta_constraint": None,
            "gamma_constraint": None}


def dense(x, kernel, bias, activation):
    y = x @ kernel.astype(np.float64) + bias
    if activation == "relu":
        return np.maximum(y, 0.0)
    if activation == "tanh":
        return np.tanh(y)
    return y


def batch_norm(x, gamma, beta, mean, variance, epsilon=0.001):
    return (x - mean) / np.sqrt(variance.astype(np.float64) + epsilon) * gamma + beta


def write_string_list(group, name, values):
    group.attrs[name] = np.array([v.encode("ascii") for v in values], dtype="S")


def tfkeras2(rng, reference):
    """outer (Functional): image (4) -> base (Sequential: dense relu 5, batch_normalization,
    dense_1 tanh 3) -> head (Dense 2)."""
    def u(*shape):
        return rng.uniform(-0.8, 0.8, shape).astype("<f4")

    weights = {
        "dense": [u(4, 5), u(5)],
        "batch_normalization": [rng.uniform(0.5, 1.5, 5).astype("<f4"), u(5), u(5),
                                rng.uniform(0.5, 2.0, 5).astype("<f4")],
        "dense_1": [u(5, 3), u(3)],
        "head": [u(3, 2), u(2)],
    }
    base = {"name": "base", "layers": [
        {"class_name": "InputLayer", "config": {"batch_input_shape": [None, 4], "dtype": "float32",
                                                "sparse": False, "ragged": False,
                                                "name": "dense_input"}},
        {"class_name": "Dense", "config": dense2("dense", 5, "relu")},
        {"class_name": "BatchNormalization", "config": batch_norm2("batch_normalization")},
        {"class_name": "Dense", "config": dense2("dense_1", 3, "tanh")}]}
    config = {"class_name": "Functional", "config": {
        "name": "outer", "trainable": True, "layers": [
            {"class_name": "InputLayer", "config": {"batch_input_shape": [None, 4],
                                                    "dtype": "float32", "sparse": False,
                                                    "ragged": False, "name": "image"},
             "name": "image", "inbound_nodes": []},
            {"class_name": "Sequential", "config": base, "name": "base",
             "inbound_nodes": [[["image", 0, 0, {}]]]},
            {"class_name": "Dense", "config": dense2("head", 2, "linear"), "name": "head",
             "inbound_nodes": [[["base", 0, 0, {}]]]}],
        "input_layers": [["image", 0, 0]], "output_layers": [["head", 0, 0]]},
        "keras_version": "2.13.1", "backend": "tensorflow"}
    # _legacy_weights(base): trainable weights of every inner layer, then the non-trainable.
    base_names = ["dense/kernel:0", "dense/bias:0", "batch_normalization/gamma:0",
                  "batch_normalization/beta:0", "dense_1/kernel:0", "dense_1/bias:0",
                  "batch_normalization/moving_mean:0", "batch_normalization/moving_variance:0"]
    base_values = (weights["dense"] + weights["batch_normalization"][:2] + weights["dense_1"] +
                   weights["batch_normalization"][2:])
    path = os.path.join(reference, "nested_tfkeras2.h5")
    with h5py.File(path, "w", track_order=False) as f:
        f.attrs["model_config"] = json.dumps(config)
        f.attrs["keras_version"] = "2.13.1"
        f.attrs["backend"] = "tensorflow"
        root = f.create_group("model_weights")
        write_string_list(root, "layer_names", ["image", "base", "head"])
        root.attrs["keras_version"] = "2.13.1"
        root.attrs["backend"] = "tensorflow"
        write_string_list(root.create_group("image"), "weight_names", [])
        group = root.create_group("base")
        write_string_list(group, "weight_names", base_names)
        for name, value in zip(base_names, base_values):
            group.create_dataset(name, data=value, track_times=False)
        group = root.create_group("head")
        head_names = ["head/kernel:0", "head/bias:0"]
        write_string_list(group, "weight_names", head_names)
        for name, value in zip(head_names, weights["head"]):
            group.create_dataset(name, data=value, track_times=False)
        write_string_list(root.create_group("top_level_model_weights"), "weight_names", [])
    x = rng.uniform(-1.0, 1.0, (3, 4)).astype("<f4")
    h = dense(x, *weights["dense"], "relu")
    h = batch_norm(h, *weights["batch_normalization"])  # inference: the moving statistics
    h = dense(h, *weights["dense_1"], "tanh")
    y = dense(h, *weights["head"], "linear")
    layer_order = (weights["dense"] + weights["batch_normalization"] + weights["dense_1"] +
                   weights["head"])
    return {"file": "nested_tfkeras2.h5", "x": x.reshape(-1).tolist(), "x_shape": [3, 4],
            "y": y.reshape(-1).tolist(), "y_shape": [3, 2],
            "weights": [{"shape": list(w.shape), "values": w.reshape(-1).tolist()}
                        for w in layer_order],
            "base_weight_names": base_names}


def dense3(name, units, activation, trainable=True):
    """Keras 3's Dense.get_config()."""
    def init(class_name, config):
        return {"module": "keras.initializers", "class_name": class_name, "config": config,
                "registered_name": None}
    return {"name": name, "trainable": trainable, "dtype": DTYPE3, "units": units,
            "activation": activation, "use_bias": True,
            "kernel_initializer": init("GlorotUniform", {"seed": None}),
            "bias_initializer": init("Zeros", {}), "kernel_regularizer": None,
            "bias_regularizer": None, "kernel_constraint": None, "bias_constraint": None}


def keras_tensor(name, shape):
    return {"class_name": "__keras_tensor__",
            "config": {"shape": shape, "dtype": "float32", "keras_history": [name, 0, 0]}}


def keras3(rng, reference):
    """outer (Sequential): input (4) -> base (Functional, frozen: x -> dense relu 3 -> dense_1 2)
    -> head (Dense 2)."""
    def u(*shape):
        return rng.uniform(-0.8, 0.8, shape).astype("<f4")

    weights = {"dense": [u(4, 3), u(3)], "dense_1": [u(3, 2), u(2)], "head": [u(2, 2), u(2)]}

    def layer(class_name, config, input_shape, name, inbound):
        return {"module": "keras.layers", "class_name": class_name, "config": config,
                "registered_name": None, "build_config": {"input_shape": input_shape},
                "name": name,
                "inbound_nodes": [{"args": [keras_tensor(inbound, input_shape)], "kwargs": {}}]}

    base = {"module": "keras.src.models.functional", "class_name": "Functional",
            "config": {"name": "base", "trainable": False, "layers": [
                {"module": "keras.layers", "class_name": "InputLayer",
                 "config": {"batch_shape": [None, 4], "dtype": "float32", "sparse": False,
                            "name": "x"},
                 "registered_name": None, "name": "x", "inbound_nodes": []},
                layer("Dense", dense3("dense", 3, "relu", False), [None, 4], "dense", "x"),
                layer("Dense", dense3("dense_1", 2, "linear", False), [None, 3], "dense_1",
                      "dense")],
                "input_layers": [["x", 0, 0]], "output_layers": [["dense_1", 0, 0]]},
            "registered_name": "Functional", "build_config": {"input_shape": [None, 4]}}
    config = {"module": "keras", "class_name": "Sequential",
              "config": {"name": "outer", "trainable": True, "dtype": DTYPE3, "layers": [
                  {"module": "keras.layers", "class_name": "InputLayer",
                   "config": {"batch_shape": [None, 4], "dtype": "float32", "sparse": False,
                              "name": "input_layer"}, "registered_name": None},
                  base,
                  {"module": "keras.layers", "class_name": "Dense",
                   "config": dense3("head", 2, "linear"), "registered_name": None,
                   "build_config": {"input_shape": [None, 2]}}],
                  "build_input_shape": [None, 4]},
              "registered_name": None, "build_config": {"input_shape": [None, 4]}}
    groups = [("vars", "outer", []),
              ("layers/functional/vars", "base", []),
              ("layers/functional/layers/input_layer/vars", "x", []),
              ("layers/functional/layers/dense/vars", "dense", weights["dense"]),
              ("layers/functional/layers/dense_1/vars", "dense_1", weights["dense_1"]),
              ("layers/dense/vars", "head", weights["head"])]
    image = io.BytesIO()
    with h5py.File(image, "w") as f:
        for path, name, arrays in groups:
            group = f.create_group(path)
            group.attrs["name"] = name
            for i, value in enumerate(arrays):
                group.create_dataset(str(i), data=value, track_times=False)
    with zipfile.ZipFile(os.path.join(reference, "nested_keras3.keras"), "w") as z:
        for name, data in [("metadata.json", json.dumps({"keras_version": "3.5.0",
                                                         "date_saved": "2024-09-01@12:00:00"})),
                           ("config.json", json.dumps(config)),
                           ("model.weights.h5", image.getvalue())]:
            z.writestr(zipfile.ZipInfo(name, date_time=(2024, 9, 1, 12, 0, 0)), data)
    x = rng.uniform(-1.0, 1.0, (3, 4)).astype("<f4")
    h = dense(x, *weights["dense"], "relu")
    h = dense(h, *weights["dense_1"], "linear")
    y = dense(h, *weights["head"], "linear")
    layer_order = weights["dense"] + weights["dense_1"] + weights["head"]
    return {"file": "nested_keras3.keras", "x": x.reshape(-1).tolist(), "x_shape": [3, 4],
            "y": y.reshape(-1).tolist(), "y_shape": [3, 2],
            "weights": [{"shape": list(w.shape), "values": w.reshape(-1).tolist()}
                        for w in layer_order],
            "groups": [{"path": path, "name": name, "size": len(arrays)}
                       for path, name, arrays in groups]}


def main():
    rng = np.random.default_rng(34)
    reference = os.path.join(HERE, "reference")
    cases = {"tfkeras2": tfkeras2(rng, reference), "keras3": keras3(rng, reference)}
    with open(os.path.join(reference, "nested_models.json"), "w") as out:
        json.dump({"generator": "tests/keras/generate_nested_models.py", **cases}, out, indent=1)
        out.write("\n")


if __name__ == "__main__":
    main()
