#!/usr/bin/python3
"""Compares the structure of Keras files loadstar writes with Keras-written files of the same kind.

Structure: groups, datasets (paths relative to their layer group, dtype, rank, contiguous and
unfiltered storage), attribute names and attribute types (string kind: fixed or variable length,
ASCII or UTF-8; dataspace: scalar or 1-D; h5py's empty float64 list), and the superblock version.

    compare_h5_structure.py --writer build/plain/tests/test_keras_files
    compare_h5_structure.py --ours DIR          # files written earlier

The writer is our test executable: its case "save_model writes the files compare_h5_structure.py
compares" writes ours_model.h5, ours_weights.h5, ours_model.keras and ours.weights.h5 into
$LOADSTAR_STRUCTURE_DIR. The fixtures come from $LOADSTAR_SHARED_DIR/fixtures/keras. Exits 77
(Meson's "skipped") when h5py or the fixtures are missing.
"""

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile

SKIP = 77

try:
    import h5py
    import numpy as np
except ImportError as error:
    print(f"skipped: h5py is not importable by {sys.executable} ({error})")
    sys.exit(SKIP)


def attribute_kind(obj, name):
    """("string", "vlen"|"fixed", "ascii"|"utf8", "scalar"|"1-D") or (class, size, dataspace)."""
    attribute = h5py.h5a.open(obj.id, name.encode())
    datatype = attribute.get_type()
    space = attribute.get_space()
    if space.get_simple_extent_type() == h5py.h5s.SCALAR:
        shape = "scalar"
    else:
        shape = f"{space.get_simple_extent_ndims()}-D"
    if datatype.get_class() == h5py.h5t.STRING:
        length = "vlen" if datatype.is_variable_str() else "fixed"
        cset = "utf8" if datatype.get_cset() == h5py.h5t.CSET_UTF8 else "ascii"
        return ("string", length, cset, shape)
    kind = {h5py.h5t.FLOAT: "float", h5py.h5t.INTEGER: "integer"}.get(datatype.get_class(), "other")
    return (kind, datatype.get_size(), shape, "empty" if space.get_simple_extent_npoints() == 0 else "")


def attributes(obj):
    return {name: attribute_kind(obj, name) for name in obj.attrs}


def names(value):
    return [n.decode() if isinstance(n, bytes) else str(n) for n in np.atleast_1d(value)] if len(
        np.atleast_1d(value)) and not np.issubdtype(np.asarray(value).dtype, np.floating) else []


def dataset_kind(dataset):
    """dtype, storage layout and filter count (ranks depend on the model, not the format)."""
    plist = dataset.id.get_create_plist()
    layout = {h5py.h5d.CONTIGUOUS: "contiguous", h5py.h5d.CHUNKED: "chunked",
              h5py.h5d.COMPACT: "compact"}.get(plist.get_layout(), "other")
    return (str(dataset.dtype), layout, plist.get_nfilters())


def superblock(path):
    with open(path, "rb") as f:
        head = f.read(9)
    return head[8] if head[:8] == b"\x89HDF\r\n\x1a\n" else None


def layer_structure(group, problems, where):
    """Kinds of the layer groups under `group` (a /model_weights group or a weights file's root)."""
    out = {"attributes": attributes(group), "layers with weights": set(), "layers without": set(),
           "datasets": set(), "top_level_model_weights": None}
    layer_names = names(group.attrs["layer_names"])
    for layer in layer_names:
        entry = group[layer]
        weight_names = names(entry.attrs["weight_names"])
        kinds = tuple(sorted(attributes(entry).items()))
        out["layers with weights" if weight_names else "layers without"].add(kinds)
        for weight in weight_names:
            # tf.keras 2.x names weights <layer>/<variable>:0, stored at that path in the group.
            if not re.fullmatch(re.escape(layer) + r"/[A-Za-z_0-9]+:0", weight):
                problems.append(f"{where}: layer '{layer}' weight name '{weight}' is not "
                                f"'<layer>/<variable>:0'")
            if weight not in entry or not isinstance(entry[weight], h5py.Dataset):
                problems.append(f"{where}: layer '{layer}': no dataset at '{weight}'")
                continue
            out["datasets"].add(dataset_kind(entry[weight]))
    if "top_level_model_weights" in group:
        out["top_level_model_weights"] = tuple(sorted(attributes(group["top_level_model_weights"]).items()))
    return out


def optimizer_structure(f, problems, where):
    if "optimizer_weights" not in f:
        return None
    group = f["optimizer_weights"]
    weight_names = names(group.attrs["weight_names"])
    out = {"attributes": attributes(group), "iteration": None, "slots": set(), "slot names": set()}
    for name in weight_names:
        dataset = group[name]
        if re.fullmatch(r"[A-Za-z_0-9]+/iter:0", name):
            out["iteration"] = (dataset_kind(dataset), dataset.shape)
        elif re.fullmatch(r"[A-Za-z_0-9]+/[A-Za-z_0-9]+/[A-Za-z_0-9]+/[A-Za-z_0-9]+:0", name):
            out["slots"].add(dataset_kind(dataset))
            out["slot names"].add(name.split("/")[-1])
        else:
            problems.append(f"{where}: optimizer weight name '{name}' is neither "
                            f"'<optimizer>/iter:0' nor '<optimizer>/<layer>/<variable>/<slot>:0'")
    return out


def legacy_structure(path, problems):
    with h5py.File(path, "r") as f:
        out = {"superblock": superblock(path), "root": attributes(f)}
        weights = f["model_weights"] if "model_config" in f.attrs else f
        out["weights"] = layer_structure(weights, problems, path)
        out["optimizer"] = optimizer_structure(f, problems, path)
        out["root groups"] = sorted(k for k in f.keys() if k in ("model_weights", "optimizer_weights"))
        return out


def compare(ours, theirs, where, problems, keys=None):
    for key in keys or sorted(set(ours) | set(theirs)):
        a, b = ours.get(key), theirs.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            compare(a, b, f"{where}.{key}", problems)
        elif isinstance(b, set) and not b:
            continue  # the Keras file has nothing of this kind (a model without such layers)
        elif a != b:
            problems.append(f"{where}.{key}: ours {a!r} but Keras's {b!r}")


def check_legacy(ours_path, fixture_path, problems, keys):
    print(f"comparing {os.path.basename(ours_path)} with {os.path.basename(fixture_path)}")
    ours = legacy_structure(ours_path, problems)
    theirs = legacy_structure(fixture_path, problems)
    compare(ours, theirs, os.path.basename(ours_path), problems, keys)


def keras3_weights_structure(h5file, problems, where):
    """Keras 3's layout: vars groups holding datasets 0, 1, ... under layers/<key> and optimizer."""
    groups = []
    h5file.visit(lambda name: groups.append(name) if isinstance(h5file[name], h5py.Group) else None)
    for name in groups:
        if not (name == "vars" or re.fullmatch(r"layers(/[a-z0-9_]+(/vars)?)?", name)
                or re.fullmatch(r"optimizer(/vars)?", name)):
            problems.append(f"{where}: group '{name}' is not in Keras 3's layout")
        if name.endswith("vars"):
            keys = sorted(h5file[name].keys(), key=int)
            if keys != [str(i) for i in range(len(keys))]:
                problems.append(f"{where}: '{name}' holds {keys}, not datasets 0..n-1")
            if "name" not in h5file[name].attrs:
                problems.append(f"{where}: '{name}' has no 'name' attribute")
    if "optimizer/vars" in h5file and len(h5file["optimizer/vars"]):
        iteration = h5file["optimizer/vars/0"]
        if iteration.dtype != np.int64 or iteration.shape != ():
            problems.append(f"{where}: optimizer/vars/0 (iterations) is {iteration.dtype} "
                            f"{iteration.shape}, not a scalar int64")


def check_keras3(directory, problems):
    # No Keras-written .keras archive or Keras 3 .weights.h5 is among the licensed fixtures: these
    # are checked against the layout Keras 3's saving_lib writes (reference/keras-h5.md, 2.10).
    archive = os.path.join(directory, "ours_model.keras")
    print(f"checking {os.path.basename(archive)} against Keras 3's archive layout "
          "(no Keras-written archive among the fixtures)")
    with zipfile.ZipFile(archive) as z:
        members = z.namelist()
        if members[:3] != ["metadata.json", "config.json", "model.weights.h5"]:
            problems.append(f"{archive}: members {members}")
        config = json.loads(z.read("config.json"))
        for key in ("module", "class_name", "config", "registered_name"):
            if key not in config:
                problems.append(f"{archive}: config.json lacks '{key}'")
        for layer in config["config"]["layers"]:
            if set(layer) < {"module", "class_name", "config", "registered_name"}:
                problems.append(f"{archive}: layer entry {layer.get('class_name')} lacks keys")
        if "compile_config" not in config:
            problems.append(f"{archive}: config.json lacks compile_config")
        if "keras_version" not in json.loads(z.read("metadata.json")):
            problems.append(f"{archive}: metadata.json lacks keras_version")
        with h5py.File(io.BytesIO(z.read("model.weights.h5")), "r") as f:
            keras3_weights_structure(f, problems, archive + ":model.weights.h5")
    weights = os.path.join(directory, "ours.weights.h5")
    print(f"checking {os.path.basename(weights)} against Keras 3's weights layout")
    with h5py.File(weights, "r") as f:
        keras3_weights_structure(f, problems, weights)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--writer", help="test executable that writes our files")
    source.add_argument("--ours", help="folder with our files, written earlier")
    parser.add_argument("--fixtures", help="Keras fixtures (default: $LOADSTAR_SHARED_DIR/fixtures/keras)")
    args = parser.parse_args()
    fixtures = args.fixtures or os.path.join(os.environ.get("LOADSTAR_SHARED_DIR", ""), "fixtures", "keras")
    if not os.path.exists(os.path.join(fixtures, "MANIFEST.tsv")):
        print(f"skipped: no Keras fixtures in '{fixtures}' (set LOADSTAR_SHARED_DIR)")
        return SKIP
    with tempfile.TemporaryDirectory() as temporary:
        directory = args.ours or temporary
        if args.writer:
            env = dict(os.environ, LOADSTAR_STRUCTURE_DIR=directory)
            run = subprocess.run([args.writer, "--no-colors",
                                  "--test-case=save_model writes the files compare_h5_structure.py compares"],
                                 env=env)
            if run.returncode != 0:
                print(f"the writer {args.writer} failed with status {run.returncode}")
                return 1
        problems = []
        ours_model = os.path.join(directory, "ours_model.h5")
        ours_weights = os.path.join(directory, "ours_weights.h5")
        # A whole model with Adam's state, as tf.keras 2.10 writes it.
        check_legacy(ours_model, os.path.join(fixtures, "purinat33_mnist_cnn_keras2.10.h5"), problems,
                     ["superblock", "root", "weights", "optimizer", "root groups"])
        # The layer groups of tf.keras 2.13 (no optimizer there).
        check_legacy(ours_model, os.path.join(fixtures, "hls4ml_conv2d_1layer.h5"), problems,
                     ["superblock", "weights"])
        # tf.keras 2.13's save_weights: layer groups at the root.
        check_legacy(ours_weights, os.path.join(fixtures, "hls4ml_conv2d_1layer_weights.h5"), problems,
                     ["superblock", "root", "weights", "root groups"])
        check_keras3(directory, problems)
        for problem in problems:
            print("MISMATCH", problem)
        print(f"{len(problems)} mismatches")
        return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
