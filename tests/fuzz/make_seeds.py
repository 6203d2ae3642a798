#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/<harness>/): small real
files of every kind each reader takes. Run from anywhere; the output is checked in, so this runs
again only when a seed is added. Needs h5py and numpy (Debian's python3-h5py, python3-numpy).

Two kinds of seeds come from loadstar itself and are written only when asked:

    tests/fuzz/make_seeds.py --loadstar build/test-plain/tools/cli/loadstar \
                             --checkpoint-harness build/fuzz/fuzz_checkpoint

--loadstar converts the h5py-written legacy models to .keras archives with the loadstar command
(keras_archive/loadstar-*.keras; their zip dates are the time of writing). --checkpoint-harness
runs the checkpoint harness (built by `tools/fuzz fuzz_checkpoint`) with LOADSTAR_FUZZ_WRITE_SEEDS,
so that it writes the files of the real trial checkpoint and Keras backup it fuzzes, each behind
its selector byte (checkpoint/). Without them, those seeds are left as they are."""
import argparse
import glob
import gzip
import io
import json
import os
import re
import struct
import subprocess
import tempfile
import zipfile
import zlib

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def corpus(name):
    path = os.path.join(HERE, "corpus", name)
    os.makedirs(path, exist_ok=True)
    return path


def idx(type_code, array):
    fmt = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}[type_code]
    header = bytes([0, 0, type_code, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    return header + array.astype(fmt).tobytes()


def idx_seeds():
    rng = np.random.default_rng(17)
    return {
        "u8-2x3": idx(0x08, np.arange(6, dtype=np.uint8).reshape(2, 3)),
        "u8-images": idx(0x08, rng.integers(0, 256, (3, 4, 4))),
        "i8": idx(0x09, np.array([-128, 0, 127])),
        "i16": idx(0x0B, np.array([[-32768, 1], [258, 32767]])),
        "i32": idx(0x0C, np.array([-(2**31), -1, 0, 2**31 - 1])),
        "f32": idx(0x0D, np.array([-1.5, 0.0, 3.25, 1e-30])),
        "f64": idx(0x0E, np.arange(8, dtype=np.float64).reshape(2, 2, 2)),
        "scalar": idx(0x08, np.array(7, dtype=np.uint8)),
        "empty": idx(0x0D, np.zeros((0, 4))),
    }


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def main():
    parser = argparse.ArgumentParser(description="Writes the fuzz harnesses' seed corpora.")
    parser.add_argument("--loadstar", help="the loadstar command, for archives loadstar writes")
    parser.add_argument("--checkpoint-harness", help="build/fuzz/fuzz_checkpoint, for its seeds")
    args = parser.parse_args()
    seeds = idx_seeds()
    plain = corpus("idx")
    packed = corpus("idx_gzip")
    for name, data in seeds.items():
        write(os.path.join(plain, name), data)
        # gzip with a fixed mtime so the seed is reproducible
        write(os.path.join(plain, name + ".gz"), gzip.compress(data, mtime=0))
        write(os.path.join(packed, name), data)

    h5 = corpus("hdf5")
    seq = corpus("hdf5_sequence")
    rng = np.random.default_rng(17)
    layouts = {
        "contiguous": {},
        "chunked": {"chunks": (2, 3)},
        "gzip": {"chunks": (2, 3), "compression": "gzip", "shuffle": True},
        "fletcher": {"chunks": (4, 3), "fletcher32": True},
        "compact": {"compact": True},
    }
    for layout, options in layouts.items():
        for dtype in ("<f4", ">f8", "<i8", "|u1"):
            name = f"{layout}-{dtype.strip('<>|')}"
            x = (rng.standard_normal((5, 3)) * 10).astype(dtype)
            y = np.arange(5).astype("<i8" if dtype[1] != "f" else dtype)
            for folder in (h5, seq):
                path = os.path.join(folder, name + ".h5")
                with h5py.File(path, "w", libver="earliest" if layout != "gzip" else "latest") as f:
                    for dataset, values in (("x", x), ("y", y)):
                        if options.get("compact"):
                            space = h5py.h5s.create_simple(values.shape)
                            plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                            plist.set_layout(h5py.h5d.COMPACT)
                            tid = h5py.h5t.py_create(values.dtype)
                            h5py.h5d.create(f.id, dataset.encode(), tid, space, plist).write(
                                h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(values))
                        elif "chunks" in options and values.ndim == 1:
                            f.create_dataset(dataset, data=values, chunks=(2,),
                                             **{k: v for k, v in options.items() if k != "chunks"})
                        else:
                            f.create_dataset(dataset, data=values, **options)
    # A scalar, an empty dataset and a dataset inside a group.
    with h5py.File(os.path.join(h5, "shapes.h5"), "w", libver="earliest") as f:
        f["x"] = np.float32(2.5)
        f["y"] = np.zeros((0, 2), dtype="<f4")
        f.create_group("g")["x"] = np.arange(3, dtype="<i4")
    # Chunks never written: a dataset read as its fill value.
    with h5py.File(os.path.join(h5, "unwritten.h5"), "w", libver="earliest") as f:
        f.create_dataset("x", shape=(4, 4), chunks=(2, 2), dtype="<f4", fillvalue=1.5)
        f.create_dataset("y", shape=(4,), chunks=(2,), dtype="<i8")

    cache = corpus("cache")
    for name, records in {
        "ints": [struct.pack("<q", v) for v in range(4)],
        "tensors": [tensor_record(np.arange(6, dtype="<f4").reshape(2, 3) + i) for i in range(3)],
        "empty": [],
    }.items():
        write(os.path.join(cache, name), cache_file(records))

    experiment_config_seeds(corpus("experiment_config"))
    legacy_model_seeds(corpus("model_h5"))
    keras_archive_seeds(corpus("keras_archive"))
    if args.loadstar:
        with tempfile.TemporaryDirectory() as temporary:
            legacy_model_seeds(temporary)
            for name in ("dense-adam", "conv-sgd", "functional"):
                subprocess.run([args.loadstar, "convert", os.path.join(temporary, name + ".h5"),
                                os.path.join(corpus("keras_archive"), f"loadstar-{name}.keras")],
                               check=True, stdout=subprocess.DEVNULL)
    if args.checkpoint_harness:
        env = dict(os.environ, LOADSTAR_FUZZ_WRITE_SEEDS=corpus("checkpoint"),
                   ASAN_OPTIONS="detect_leaks=0")
        subprocess.run([args.checkpoint_harness, "-runs=0"], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def tensor_record(array):
    # Serializer<Tensor<float>>: u8 rank, u64 dims, padding to 64 bytes, data.
    head = bytes([array.ndim]) + b"".join(struct.pack("<Q", d) for d in array.shape)
    head += b"\0" * ((64 - len(head) % 64) % 64)
    return head + array.tobytes()


def cache_file(records):
    # detail/cache_file.hpp: 48-byte header, payload, count + 1 u64 offsets.
    payload = b"".join(records)
    offsets = [0]
    for r in records:
        offsets.append(offsets[-1] + len(r))
    table = b"".join(struct.pack("<Q", o) for o in offsets)
    crc = zlib.crc32(payload + table)
    header = b"LDSCACHE" + struct.pack("<IIQQII", 1, 0, len(records), len(payload), crc, 0)
    header += b"\0" * 8
    return header + payload + table


# --- experiment configs (fuzz_experiment_config) ------------------------------------------------

def experiment_config_seeds(folder):
    # The example experiments, and the configs the trial tests parse (their raw strings).
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "**", "*.yaml"), recursive=True)):
        with open(path, "rb") as f:
            write(os.path.join(folder, "example-" + os.path.basename(path)), f.read())
    tests = sorted(glob.glob(os.path.join(ROOT, "tests", "trial", "**", "*.?pp"), recursive=True))
    for path in tests:
        with open(path, encoding="utf-8") as f:
            texts = [t for t in re.findall(r'R"\((.*?)\)"', f.read(), re.S)
                     if "entrypoint" in t or "searcher:" in t]
        stem = os.path.splitext(os.path.basename(path))[0]
        for i, text in enumerate(texts):
            write(os.path.join(folder, f"{stem}-{i}.yaml"), text.encode())
    base = (b"entrypoint: model_def:Trial\nhyperparameters:\n  global_batch_size: 32\n"
            b"searcher: {name: single, metric: val_loss, max_length: {batches: 100}}\n")
    write(os.path.join(folder, "not-utf8"), b"\x91\x40")
    # Bytes that are not UTF-8 in a value, in a key, in a nested hyperparameter and in `data`.
    write(os.path.join(folder, "not-utf8-value.yaml"), base + b"description: caf\xe9 \x91\x40\n")
    write(os.path.join(folder, "not-utf8-key.yaml"), base + b"\xff\xfekey: 1\n")
    write(os.path.join(folder, "not-utf8-hparam.yaml"),
          base.replace(b"  global_batch_size: 32\n",
                       b"  global_batch_size: 32\n  opt\xe9: {type: const, val: \"\x91\"}\n"))
    write(os.path.join(folder, "not-utf8-data.yaml"), base + b"data: {url: \"\x80\xff\"}\n")
    write(os.path.join(folder, "not-utf8-label.yaml"), base + b"labels: [\xc3\x28]\n")


# --- Keras model files (fuzz_model_h5, fuzz_keras_archive) -------------------------------------

def initializer(name, keras3):
    value = {"class_name": name, "config": {"seed": None} if name != "Zeros" else {}}
    if keras3:
        value = {"module": "keras.initializers", **value, "registered_name": None}
    return value


def layer_config(class_name, name, keras3, **options):
    """The config of one layer as tf.keras 2.13 (keras3=False) or Keras 3.5 writes it."""
    dtype = ({"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"},
              "registered_name": None} if keras3 else "float32")
    config = {"name": name, "trainable": True, "dtype": dtype}
    if class_name in ("Dense", "Conv2D"):
        if class_name == "Conv2D":
            config.update(filters=options["filters"], kernel_size=[3, 3], strides=[1, 1],
                          padding="valid", data_format="channels_last", dilation_rate=[1, 1],
                          groups=1)
        else:
            config["units"] = options["units"]
        config.update(activation=options.get("activation", "linear"), use_bias=True,
                      kernel_initializer=initializer("GlorotUniform", keras3),
                      bias_initializer=initializer("Zeros", keras3), kernel_regularizer=None,
                      bias_regularizer=None, activity_regularizer=None, kernel_constraint=None,
                      bias_constraint=None)
    elif class_name == "MaxPooling2D":
        config.update(pool_size=[2, 2], padding="valid", strides=[2, 2],
                      data_format="channels_last")
    elif class_name == "Flatten":
        config["data_format"] = "channels_last"
    elif class_name == "Dropout":
        config.update(rate=0.25, noise_shape=None, seed=None)
    return config


# Three small models: (name, input shape, layers as (class, name, options, weight shapes)).
DENSE = ("dense", (4,), [("Dense", "dense", {"units": 3, "activation": "relu"}, [(4, 3), (3,)]),
                         ("Dense", "dense_1", {"units": 2, "activation": "softmax"},
                          [(3, 2), (2,)])])
CONV = ("conv", (6, 6, 1), [("Conv2D", "conv2d", {"filters": 2, "activation": "relu"},
                             [(3, 3, 1, 2), (2,)]),
                            ("MaxPooling2D", "max_pooling2d", {}, []),
                            ("Flatten", "flatten", {}, []),
                            ("Dense", "dense", {"units": 2}, [(8, 2), (2,)])])
FUNCTIONAL = ("functional", (5,), [("Dense", "dense", {"units": 4, "activation": "tanh"},
                                    [(5, 4), (4,)]),
                                   ("Dropout", "dropout", {}, []),
                                   ("Dense", "dense_1", {"units": 1}, [(4, 1), (1,)])])


def weights_of(model, seed):
    rng = np.random.default_rng(seed)
    return {name: [rng.standard_normal(shape).astype("<f4") for shape in shapes]
            for _, name, _, shapes in model[2]}


def weight_names(name, shapes):
    return [f"{name}/{'kernel' if len(shape) > 1 else 'bias'}:0" for shape in shapes]


def legacy_config(model, functional):
    _, shape, layers = model
    entries = [{"class_name": "InputLayer",
                "config": {"batch_input_shape": [None, *shape], "dtype": "float32",
                           "sparse": False, "ragged": False, "name": "input_1"}}]
    for class_name, name, options, _ in layers:
        entries.append({"class_name": class_name,
                        "config": layer_config(class_name, name, False, **options)})
    if not functional:
        return {"class_name": "Sequential", "config": {"name": "sequential", "layers": entries}}
    previous = None
    for entry in entries:
        entry["name"] = entry["config"]["name"]
        entry["inbound_nodes"] = [[[previous, 0, 0, {}]]] if previous else []
        previous = entry["name"]
    return {"class_name": "Functional",
            "config": {"name": "model", "layers": entries, "input_layers": [["input_1", 0, 0]],
                       "output_layers": [[previous, 0, 0]]}}


def legacy_optimizer(kind):
    if kind == "adam":
        return {"class_name": "Adam", "config": {"name": "Adam", "learning_rate": 0.001,
                                                 "decay": 0.0, "beta_1": 0.9, "beta_2": 0.999,
                                                 "epsilon": 1e-07, "amsgrad": False}}
    return {"class_name": "SGD", "config": {"name": "SGD", "learning_rate": 0.01, "decay": 0.0,
                                            "momentum": 0.9, "nesterov": False}}


def string_list(values, vlen):
    if vlen:
        return np.array(values, dtype=h5py.string_dtype())
    return np.array([v.encode() for v in values]) if values else np.zeros((0,), dtype="S1")


def write_legacy(path, model, optimizer=None, slots=False, functional=False, vlen=False):
    """tf.keras 2.x's model.save("m.h5"): root model_config (and training_config), /model_weights
    with layer_names and a group per layer, /optimizer_weights with OptimizerV2's names. `vlen`:
    h5py 3's variable-length str attributes (tf.keras 2.13) instead of fixed-length bytes."""
    weights = weights_of(model, 3)
    text = (lambda v: v) if vlen else (lambda v: v.encode())
    with h5py.File(path, "w", libver="earliest") as f:
        f.attrs["backend"] = text("tensorflow")
        f.attrs["keras_version"] = text("2.13.1")
        f.attrs["model_config"] = text(json.dumps(legacy_config(model, functional)))
        if optimizer:
            loss = "sparse_categorical_crossentropy" if model is not FUNCTIONAL else "mse"
            f.attrs["training_config"] = text(json.dumps(
                {"loss": loss, "metrics": [[{"class_name": "MeanMetricWrapper", "config": {
                    "name": "accuracy", "dtype": "float32", "fn": "sparse_categorical_accuracy"}}]]
                 if loss != "mse" else None, "weighted_metrics": None, "loss_weights": None,
                 "optimizer_config": legacy_optimizer(optimizer)}))
        group = f.create_group("model_weights")
        names = ["input_1"] if functional else []
        names += [name for _, name, _, _ in model[2]]
        group.attrs["backend"] = text("tensorflow")
        group.attrs["keras_version"] = text("2.13.1")
        group.attrs["layer_names"] = string_list(names, vlen)
        for name in names:
            layer = group.create_group(name)
            shapes = [w.shape for w in weights.get(name, [])]
            layer.attrs["weight_names"] = string_list(weight_names(name, shapes), vlen)
            for weight_name, value in zip(weight_names(name, shapes), weights.get(name, [])):
                layer[weight_name] = value
        group.create_group("top_level_model_weights").attrs["weight_names"] = string_list([], vlen)
        if optimizer and slots:
            prefix = "Adam" if optimizer == "adam" else "SGD"
            kinds = ["m", "v"] if optimizer == "adam" else ["momentum"]
            variables = []  # (layer, variable, value) in the model's order
            for name in names:
                values = weights.get(name, [])
                for weight_name, value in zip(weight_names(name, [v.shape for v in values]), values):
                    variables.append((name, weight_name.split("/")[1][:-2], value))
            opt = f.create_group("optimizer_weights")
            slot_names = [f"{prefix}/iter:0"]
            opt[slot_names[0]] = np.int64(12)
            for kind in kinds:  # OptimizerV2 groups the slots by kind
                for layer_name, variable, value in variables:
                    slot_names.append(f"{prefix}/{layer_name}/{variable}/{kind}:0")
                    opt[slot_names[-1]] = (value * 0.01).astype("<f4")
            opt.attrs["weight_names"] = string_list(slot_names, vlen)


def write_legacy_weights(path, model):
    """tf.keras 2.x's model.save_weights("w.h5"): root layer_names and layer groups."""
    weights = weights_of(model, 5)
    with h5py.File(path, "w", libver="earliest") as f:
        names = [name for _, name, _, _ in model[2]]
        f.attrs["backend"] = b"tensorflow"
        f.attrs["keras_version"] = b"2.13.1"
        f.attrs["layer_names"] = string_list(names, False)
        for name in names:
            shapes = [w.shape for w in weights.get(name, [])]
            layer = f.create_group(name)
            layer.attrs["weight_names"] = string_list(weight_names(name, shapes), False)
            for weight_name, value in zip(weight_names(name, shapes), weights.get(name, [])):
                layer[weight_name] = value


def legacy_model_seeds(folder):
    write_legacy(os.path.join(folder, "dense.h5"), DENSE)
    write_legacy(os.path.join(folder, "dense-adam.h5"), DENSE, "adam", slots=True)
    write_legacy(os.path.join(folder, "dense-adam-no-slots.h5"), DENSE, "adam", vlen=True)
    write_legacy(os.path.join(folder, "conv.h5"), CONV, "sgd", vlen=True)
    write_legacy(os.path.join(folder, "conv-sgd.h5"), CONV, "sgd", slots=True, vlen=True)
    write_legacy(os.path.join(folder, "functional.h5"), FUNCTIONAL, "adam", slots=True,
                 functional=True)
    write_legacy_weights(os.path.join(folder, "dense-weights-only.h5"), DENSE)


def keras3_config(model, functional, optimizer):
    """Keras 3.5's config.json (serialize_keras_object(model)) for a model of this file."""
    _, shape, layers = model
    batch_shape = [None, *shape]
    entries = []
    if functional:
        entries.append({"module": "keras.layers", "class_name": "InputLayer",
                        "config": {"batch_shape": batch_shape, "dtype": "float32",
                                   "sparse": False, "name": "input_layer"},
                        "registered_name": None, "name": "input_layer", "inbound_nodes": []})
    previous, input_shape = "input_layer", batch_shape
    shapes = {"Conv2D": lambda s: [None, s[1] - 2, s[2] - 2, 2],
              "MaxPooling2D": lambda s: [None, s[1] // 2, s[2] // 2, s[3]],
              "Flatten": lambda s: [None, int(np.prod(s[1:]))], "Dropout": lambda s: s}
    for class_name, name, options, _ in layers:
        entry = {"module": "keras.layers", "class_name": class_name,
                 "config": layer_config(class_name, name, True, **options),
                 "registered_name": None, "build_config": {"input_shape": input_shape}}
        if functional:
            entry["name"] = name
            entry["inbound_nodes"] = [{"args": [{"class_name": "__keras_tensor__", "config": {
                "shape": input_shape, "dtype": "float32", "keras_history": [previous, 0, 0]}}],
                                       "kwargs": {}}]
        entries.append(entry)
        previous = name
        output = options.get("units")
        input_shape = [None, output] if output else shapes[class_name](input_shape)
    if functional:
        config = {"module": "keras.src.models.functional", "class_name": "Functional",
                  "config": {"name": "functional", "trainable": True, "layers": entries,
                             "input_layers": [["input_layer", 0, 0]],
                             "output_layers": [[previous, 0, 0]]},
                  "registered_name": "Functional", "build_config": {"input_shape": None}}
    else:
        config = {"module": "keras", "class_name": "Sequential",
                  "config": {"name": "sequential", "trainable": True,
                             "dtype": layer_config("Flatten", "", True)["dtype"],
                             "layers": [{"module": "keras.layers", "class_name": "InputLayer",
                                         "config": {"batch_shape": batch_shape,
                                                    "dtype": "float32", "sparse": False,
                                                    "name": "input_layer"},
                                         "registered_name": None}] + entries,
                             "build_input_shape": batch_shape},
                  "registered_name": None, "build_config": {"input_shape": batch_shape}}
    if optimizer:
        adam = optimizer == "adam"
        options = ({"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-07, "amsgrad": False} if adam
                   else {"momentum": 0.9, "nesterov": False})
        config["compile_config"] = {
            "optimizer": {"module": "keras.optimizers", "class_name": "Adam" if adam else "SGD",
                          "config": {"name": "adam" if adam else "SGD",
                                     "learning_rate": 0.001 if adam else 0.01,
                                     "weight_decay": None, "clipnorm": None,
                                     "global_clipnorm": None, "clipvalue": None, "use_ema": False,
                                     "ema_momentum": 0.99, "ema_overwrite_frequency": None,
                                     "loss_scale_factor": None,
                                     "gradient_accumulation_steps": None, **options},
                          "registered_name": None},
            "loss": "mean_squared_error" if functional else "sparse_categorical_crossentropy",
            "loss_weights": None, "metrics": None if functional else ["accuracy"],
            "weighted_metrics": None, "run_eagerly": False, "steps_per_execution": 1,
            "jit_compile": False}
    return config


def snake_case(name):
    return re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", name).lower()


def keras3_weights(model, functional, optimizer):
    """model.weights.h5 in Keras 3's layout: layers/<snake_case class>/vars/<i>, optimizer/vars
    (iterations, learning rate, then each variable's slots)."""
    weights = weights_of(model, 7)
    image = io.BytesIO()
    with h5py.File(image, "w", libver="earliest") as f:
        f.create_group("vars").attrs["name"] = "sequential" if not functional else "functional"
        classes = [("InputLayer", "input_layer")] if functional else []
        classes += [(class_name, name) for class_name, name, _, _ in model[2]]
        seen = {}
        for class_name, name in classes:
            key = snake_case(class_name)
            count = seen.get(key, 0)
            seen[key] = count + 1
            vars_group = f.create_group(f"layers/{key}{'_' + str(count) if count else ''}/vars")
            vars_group.attrs["name"] = name
            for i, value in enumerate(weights.get(name, [])):
                vars_group[str(i)] = value
        if optimizer:
            vars_group = f.create_group("optimizer/vars")
            vars_group.attrs["name"] = "adam" if optimizer == "adam" else "SGD"
            vars_group["0"] = np.int64(3)
            vars_group["1"] = np.float32(0.001 if optimizer == "adam" else 0.01)
            index = 2
            for name in [name for _, name, _, _ in model[2]]:
                for value in weights.get(name, []):
                    for _ in range(2 if optimizer == "adam" else 1):
                        vars_group[str(index)] = (value * 0.1).astype("<f4")
                        index += 1
    return image.getvalue()


def write_archive(path, members, compression=zipfile.ZIP_STORED):
    # A fixed date, so that the archive is reproducible.
    with zipfile.ZipFile(path, "w", compression) as z:
        for name, data in members:
            z.writestr(zipfile.ZipInfo(name, date_time=(2024, 9, 1, 12, 0, 0)), data,
                       compress_type=compression)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def patch_member(archive, name, crc=None, size=None):
    """The archive with member `name`'s CRC-32 or uncompressed size replaced in its local header
    and its central directory entry (so that the two still agree)."""
    data = bytearray(archive)
    encoded = name.encode()
    # (signature, offset of the CRC-32 in the header, offset of the name)
    for signature, crc_at, name_at in ((b"PK\x03\x04", 14, 30), (b"PK\x01\x02", 16, 46)):
        at = data.find(signature)
        while at >= 0 and data[at + name_at:at + name_at + len(encoded)] != encoded:
            at = data.find(signature, at + 4)
        assert at >= 0, f"no {signature} header of {name}"
        if crc is not None:
            data[at + crc_at:at + crc_at + 4] = struct.pack("<I", crc)
        if size is not None:  # the uncompressed size follows the CRC-32 and compressed size
            data[at + crc_at + 8:at + crc_at + 12] = struct.pack("<I", size)
    return bytes(data)


def keras_archive_seeds(folder):
    """Keras 3's model.save("m.keras"): a zip of metadata.json, config.json, model.weights.h5."""
    metadata = json.dumps({"keras_version": "3.5.0", "date_saved": "2024-09-01@12:00:00"})
    for name, model, functional, optimizer, compression in (
            ("dense-adam", DENSE, False, "adam", zipfile.ZIP_STORED),
            ("dense", DENSE, False, None, zipfile.ZIP_STORED),
            ("conv-sgd-deflated", CONV, False, "sgd", zipfile.ZIP_DEFLATED),
            ("functional-adam", FUNCTIONAL, True, "adam", zipfile.ZIP_STORED)):
        config = json.dumps(keras3_config(model, functional, optimizer))
        write_archive(os.path.join(folder, name + ".keras"),
                      [("metadata.json", metadata), ("config.json", config),
                       ("model.weights.h5", keras3_weights(model, functional, optimizer))],
                      compression)
    # Hostile archives: a member whose CRC-32 is wrong in both of its headers, and one that
    # declares 4 GiB uncompressed in both (its deflated bytes hold a few kilobytes).
    valid = read(os.path.join(folder, "dense-adam.keras"))
    write(os.path.join(folder, "bad-crc.keras"), patch_member(valid, "config.json", crc=0x12345678))
    deflated = read(os.path.join(folder, "conv-sgd-deflated.keras"))
    write(os.path.join(folder, "huge-declared-size.keras"),
          patch_member(deflated, "model.weights.h5", size=0xFFFFFF00))
    # An archive without weights, and one with Keras 3's assets folder besides the three members.
    write_archive(os.path.join(folder, "no-weights.keras"),
                  [("metadata.json", metadata),
                   ("config.json", json.dumps(keras3_config(DENSE, False, None)))])
    write_archive(os.path.join(folder, "assets.keras"),
                  [("metadata.json", metadata),
                   ("config.json", json.dumps(keras3_config(DENSE, False, None))),
                   ("model.weights.h5", keras3_weights(DENSE, False, None)),
                   ("assets/vocabulary.txt", "a\nb\n")])


if __name__ == "__main__":
    main()
