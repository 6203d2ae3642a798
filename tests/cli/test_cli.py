#!/usr/bin/python3
"""End-to-end tests of the `loadstar` command-line tool: runs the built executable as a process.

Usage: /usr/bin/python3 tests/cli/test_cli.py PATH/TO/loadstar
Needs NumPy and h5py (Debian's python3-numpy, python3-h5py); exits 77 (skipped) without them.
Expected values never come from loadstar itself: models are written here with h5py in the legacy
Keras HDF5 layout (or as Keras JSON with constant initializers), their outputs computed with
NumPy; the conformance fixtures under $LOADSTAR_SHARED_DIR/fixtures/keras/ carry outputs Keras
computed. Every case prints "ok", "skip: reason" or "FAIL: reason"; the exit status is 1 when one
failed.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback
import zipfile

try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

LOADSTAR = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else "loadstar"
SHARED = os.environ.get("LOADSTAR_SHARED_DIR", "")
FIXTURES = os.path.join(SHARED, "fixtures", "keras") if SHARED else ""
WORK = tempfile.mkdtemp(prefix="loadstar-cli-test-")

CASES = []


class Skip(Exception):
    pass


def case(f):
    CASES.append(f)
    return f


def path(name):
    return os.path.join(WORK, name)


def run(*args, rc=0):
    """Runs loadstar with `args`; checks the exit status; returns (stdout, stderr)."""
    p = subprocess.run([LOADSTAR, *map(str, args)], capture_output=True, text=True, timeout=300)
    if p.returncode != rc:
        raise AssertionError(f"loadstar {' '.join(map(str, args))}: exit status {p.returncode}, "
                             f"expected {rc}\nstdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-2000:]}")
    return p.stdout, p.stderr


def run_error(args, rc, contains):
    """Runs loadstar expecting failure: status `rc`, nothing on stdout, one error line on stderr
    that contains `contains`."""
    out, err = run(*args, rc=rc)
    lines = err.splitlines()
    assert len(lines) == 1, f"loadstar {args}: expected one line on stderr but got {err!r}"
    assert re.fullmatch(r"loadstar: error: \S.*", lines[0]), f"malformed error line {lines[0]!r}"
    assert contains in lines[0], f"loadstar {args}: {lines[0]!r} lacks {contains!r}"
    assert out == "", f"loadstar {args}: expected nothing on stdout but got {out!r}"
    return lines[0]


def close(actual, expected, what, rtol=1e-5, atol=1e-6):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    bad = ~np.isclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {bad.sum()} values differ; first at {i}: "
                             f"{actual[i]!r} but expected {expected[i]!r}")


# --- model files written independently of loadstar -------------------------------------------

def dense_config(name, units, activation="linear", kernel=None, bias=None, **extra):
    config = {"name": name, "trainable": True, "dtype": "float32", "units": units,
              "activation": activation, "use_bias": True,
              "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": None}},
              "bias_initializer": {"class_name": "Zeros", "config": {}},
              "kernel_regularizer": None, "bias_regularizer": None,
              "activity_regularizer": None, "kernel_constraint": None, "bias_constraint": None}
    if kernel is not None:
        config["kernel_initializer"] = {"class_name": "Constant", "config": {"value": kernel}}
    if bias is not None:
        config["bias_initializer"] = {"class_name": "Constant", "config": {"value": bias}}
    config.update(extra)
    return {"class_name": "Dense", "config": config}


def input_config(name, shape):
    return {"class_name": "InputLayer",
            "config": {"batch_input_shape": [None, *shape], "dtype": "float32", "sparse": False,
                       "ragged": False, "name": name}}


def sequential(name, input_shape, layers):
    return {"class_name": "Sequential",
            "config": {"name": name, "layers": [input_config(name + "_input", input_shape),
                                                *layers]},
            "keras_version": "2.13.1", "backend": "tensorflow"}


# A Sequential MLP with constant weights: y = (relu(x @ 0.5 + 0.1)) @ -0.25.
MLP_JSON = sequential("mlp", [4], [dense_config("hidden", 3, "relu", kernel=0.5, bias=0.1),
                                   dense_config("out", 2, kernel=-0.25, bias=0.0)])


def mlp_reference(x):
    h = np.maximum(x.astype(np.float64) @ np.full((4, 3), 0.5) + 0.1, 0.0)
    return h @ np.full((3, 2), -0.25)


# A functional model with two inputs and two outputs, constant weights:
# total = concat(a, b) @ 1 (the sum of all features), scaled = a @ 2 + 1.
def functional_json():
    def node(layer, inbound):
        layer = dict(layer)
        layer["name"] = layer["config"]["name"]
        layer["inbound_nodes"] = [[[n, 0, 0, {}] for n in inbound]] if inbound else []
        return layer
    layers = [
        node(input_config("a", [2]), []),
        node(input_config("b", [3]), []),
        node({"class_name": "Concatenate",
              "config": {"name": "joined", "trainable": True, "dtype": "float32", "axis": -1}},
             ["a", "b"]),
        node(dense_config("total", 1, kernel=1.0, bias=0.0), ["joined"]),
        node(dense_config("scaled", 2, kernel=2.0, bias=1.0), ["a"]),
    ]
    return {"class_name": "Functional",
            "config": {"name": "two_by_two", "layers": layers,
                       "input_layers": [["a", 0, 0], ["b", 0, 0]],
                       "output_layers": [["total", 0, 0], ["scaled", 0, 0]]},
            "keras_version": "2.13.1", "backend": "tensorflow"}


def write_json(name, config):
    with open(path(name), "w") as f:
        json.dump(config, f)
    return path(name)


def write_keras_h5(file, config, weights):
    """Writes a whole model in tf.keras 2's legacy HDF5 layout (keras/saving/legacy/hdf5_format.py):
    `model_config` as a root attribute, each layer's weights under
    /model_weights/<layer>/<layer>/<weight>:0, listed by the `layer_names` and `weight_names`
    attributes. `weights` maps layer names to [(weight name, array)] in Keras's order."""
    with h5py.File(file, "w") as f:
        f.attrs["keras_version"] = b"2.13.1"
        f.attrs["backend"] = b"tensorflow"
        f.attrs["model_config"] = json.dumps(config).encode()
        g = f.create_group("model_weights")
        g.attrs["keras_version"] = b"2.13.1"
        g.attrs["backend"] = b"tensorflow"
        layer_names = [l["config"]["name"] for l in config["config"]["layers"]
                       if l["class_name"] != "InputLayer"]
        g.attrs["layer_names"] = np.array([n.encode() for n in layer_names])
        for layer in layer_names:
            lg = g.create_group(layer)
            names = [f"{layer}/{w}:0" for w, _ in weights.get(layer, [])]
            lg.attrs["weight_names"] = np.array([n.encode() for n in names], dtype="S")
            for (w, value), n in zip(weights.get(layer, []), names):
                lg.create_dataset(n, data=np.asarray(value, dtype=np.float32))
    return file


RNG = np.random.default_rng(20261123)
# A Sequential classifier with random weights: softmax(tanh(x @ W1 + b1) @ W2 + b2).
CLF_W = {"dense": [("kernel", RNG.uniform(-1, 1, (5, 4))), ("bias", RNG.uniform(-1, 1, 4))],
         "dense_1": [("kernel", RNG.uniform(-1, 1, (4, 3))), ("bias", RNG.uniform(-1, 1, 3))]}
CLF_CONFIG = sequential("classifier", [5], [dense_config("dense", 4, "tanh"),
                                            dense_config("dense_1", 3, "softmax")])


def clf_reference(x):
    w = {k: [np.asarray(v, dtype=np.float32).astype(np.float64) for _, v in ws]
         for k, ws in CLF_W.items()}
    h = np.tanh(x.astype(np.float64) @ w["dense"][0] + w["dense"][1])
    z = h @ w["dense_1"][0] + w["dense_1"][1]
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def classifier_h5():
    return write_keras_h5(path("classifier.h5"), CLF_CONFIG, CLF_W)


def require_fixture(name):
    if not FIXTURES:
        raise Skip("LOADSTAR_SHARED_DIR is not set")
    file = os.path.join(FIXTURES, name)
    if not os.path.exists(file):
        raise Skip(f"fixture {file} is absent")
    return file


def parse_text_outputs(text):
    """Parses predict's text output: `# name: shape (...)` headers, then rows of numbers."""
    outputs = {}
    current = None
    for line in text.splitlines():
        m = re.fullmatch(r"# (\S+): shape (\(.*\))", line)
        if m:
            current = m.group(1)
            outputs[current] = {"shape": eval(m.group(2)), "rows": []}  # a Python tuple literal
        else:
            assert current is not None, f"a row before any header: {line!r}"
            outputs[current]["rows"].append([float(v) for v in line.split()])
    return {k: np.array(v["rows"], dtype=np.float64).reshape(v["shape"])
            for k, v in outputs.items()}


# --- help and usage ---------------------------------------------------------------------------

@case
def help_of_every_command():
    out, err = run("--help")
    assert "Usage: loadstar [OPTIONS] SUBCOMMAND" in out and err == "", out
    for command in ["summary", "predict", "convert", "weights"]:
        assert re.search(rf"^  {command} +\S", out, re.M), f"--help does not list {command}"
        out_c, err_c = run(command, "--help")
        assert f"Usage: loadstar {command} [OPTIONS] MODEL" in out_c, out_c
        assert err_c == ""
    out, _ = run("predict", "--help")
    for option in ["--input", "--dataset", "--output", "--batch-size", "--weights"]:
        assert option in out, f"predict --help lacks {option}"
    out, _ = run("convert", "--help")
    assert "OUT" in out and "--no-optimizer" in out
    out, _ = run("weights", "--help")
    assert "--json" in out
    out, _ = run("--version")
    assert re.fullmatch(r"loadstar \d+\.\d+\.\d+\n", out), out


@case
def bad_usage_gives_one_line_and_status_2():
    model = write_json("mlp.json", MLP_JSON)
    np.save(path("x4.npy"), np.zeros((2, 4), dtype=np.float32))
    with h5py.File(path("x4.h5"), "w") as f:
        f["x"] = np.zeros((2, 4), dtype=np.float32)
    x = path("x4.npy")
    cases = [
        ([], "A subcommand is required"),
        (["frobnicate"], "unknown command 'frobnicate'"),
        (["summary"], "MODEL is required"),
        (["summary", model, "extra"], "not expected: extra"),
        (["weights", model, "--bogus"], "--bogus"),
        (["predict", model], "--input is required"),
        (["predict", model, "-i", x, "--batch-size", "0"], "--batch-size"),
        (["predict", model, "-i", x, "--batch-size", "many"], "--batch-size"),
        (["predict", model, "-i", x, "--output", path("y.txt")], "--output must end in .npy"),
        (["predict", model, "-i", x, "--dataset", "x"], "no --input is an HDF5 file"),
        (["predict", model, "-i", path("x4.h5")], "--dataset is required"),
        (["predict", model, "-i", x, "--output-dataset", "y"], "--output-dataset needs"),
        (["convert", model], "OUT is required"),
        (["convert", model, path("out.zip")], "OUT must end in .h5, .hdf5 or .keras"),
    ]
    for args, message in cases:
        run_error(args, 2, message)


@case
def bad_files_give_one_line_and_status_1():
    model = write_json("mlp.json", MLP_JSON)
    np.save(path("x4.npy"), np.zeros((2, 4), dtype=np.float32))
    np.save(path("x5.npy"), np.zeros((2, 5), dtype=np.float32))
    np.save(path("fortran.npy"), np.asfortranarray(np.zeros((2, 4), dtype=np.float32)))
    with open(path("junk.h5"), "wb") as f:
        f.write(b"\x89HDF\r\n\x1a\n" + b"\x00" * 100)
    with open(path("text.h5"), "wb") as f:
        f.write(b"not a model at all\n")
    with open(path("truncated.json"), "w") as f:
        f.write(json.dumps(MLP_JSON)[:40])
    unknown = json.loads(json.dumps(MLP_JSON))
    unknown["config"]["layers"][1]["class_name"] = "Frobnicate"
    write_json("unknown.json", unknown)
    with open(path("short.npy"), "wb") as f:
        f.write(open(path("x4.npy"), "rb").read()[:-3])
    with h5py.File(path("x.h5"), "w") as f:
        f["x"] = np.zeros((2, 4), dtype=np.float32)
    two = write_json("two.json", functional_json())
    whole = classifier_h5()
    with open(path("half.h5"), "wb") as f:
        f.write(open(whole, "rb").read()[:3000])
    with open(path("fake.keras"), "wb") as f:
        f.write(b"PK\x03\x04" + b"\x00" * 60)
    with h5py.File(write_keras_h5(path("odd_optimizer.h5"), CLF_CONFIG, CLF_W), "a") as f:
        f.attrs["training_config"] = json.dumps(
            {"loss": "mse", "metrics": [],
             "optimizer_config": {"class_name": "Frobnicator", "config": {}}}).encode()
    x = path("x4.npy")
    cases = [
        (["convert", path("odd_optimizer.h5"), path("odd.keras")],
         "unknown optimizer 'Frobnicator'"),
        (["convert", path("odd_optimizer.h5"), path("odd.keras")], "--no-optimizer converts"),
        (["predict", path("absent.h5"), "-i", x], "absent.h5': cannot open (No such file or directory)"),
        (["summary", path("half.h5")], "truncated file"),
        (["weights", path("fake.keras")], "fake.keras"),
        (["convert", whole, path("absent/out.keras")], "out.keras"),
        (["predict", two, "--weights", whole, "-i", x, "-i", x], "classifier.h5"),
        (["summary", path("absent.h5")], "absent.h5"),
        (["summary", WORK], "is a directory"),
        (["summary", path("junk.h5")], "junk.h5"),
        (["weights", path("text.h5")], "text.h5"),
        (["summary", path("truncated.json")], "is not JSON"),
        (["summary", path("unknown.json")], "Frobnicate"),
        (["predict", model, "-i", path("absent.npy")], "absent.npy"),
        (["predict", model, "-i", path("fortran.npy")], "fortran_order is True"),
        (["predict", model, "-i", path("short.npy")], "needs 32 bytes of data but the file holds 29"),
        (["predict", model, "-i", path("text.h5")], "expected a NumPy .npy file or an HDF5 file"),
        (["predict", model, "-i", path("x5.npy")], "expects samples of shape (4,) but x has samples of shape (5,)"),
        (["predict", model, "-i", path("x.h5"), "-d", "/nope"], "'/nope' missing"),
        (["predict", two, "-i", x], "has 2 inputs (a, b) but 1 array was given"),
        (["predict", two, "-i", path("x4.npy"), "-i", x, "-o", path("y.npy")], ""),
        (["predict", model, "-i", x, "-o", path("absent/y.npy")], "y.npy"),
    ]
    for args, message in cases:
        run_error(args, 1, message)
    # Every layer class loadstar lacks at once, without advice the tool's user cannot follow.
    several = json.loads(json.dumps(MLP_JSON))
    several["config"]["layers"][1]["class_name"] = "Frobnicate"
    several["config"]["layers"][2]["class_name"] = "Quux"
    line = run_error(["summary", write_json("several.json", several)], 1,
                     "2 layers have classes loadstar does not support: 'hidden' (Frobnicate, "
                     "config.layers[1]), 'out' (Quux, config.layers[2])")
    assert "custom" not in line, f"{line!r} mentions custom objects"
    line = run_error(["summary", path("unknown.json")], 1,
                     "layer 'hidden' (config.layers[1]) has class 'Frobnicate', which loadstar "
                     "does not support")
    assert "custom" not in line, f"{line!r} mentions custom objects"


# --- summary ----------------------------------------------------------------------------------

@case
def summary_prints_the_keras_table():
    out, err = run("summary", write_json("mlp.json", MLP_JSON))
    # tf.keras 2.13's model.summary() of this model, line for line.
    expected = """Model: "mlp"
_________________________________________________________________
 Layer (type)                Output Shape              Param #   
=================================================================
 hidden (Dense)              (None, 3)                 15        
                                                                 
 out (Dense)                 (None, 2)                 8         
                                                                 
=================================================================
Total params: 23
Trainable params: 23
Non-trainable params: 0
_________________________________________________________________
"""
    assert out.splitlines() == expected.splitlines(), out
    assert err == ""


@case
def summary_of_a_functional_model_lists_connections():
    out, _ = run("summary", write_json("two.json", functional_json()))
    lines = out.splitlines()
    assert lines[0] == 'Model: "two_by_two"'
    assert re.match(r" Layer \(type\) +Output Shape +Param # +Connected to", lines[2]), lines[2]
    rows = {m.group(1): m for m in (re.match(r" (\w+) \((\w+)\) +(\[?\(None, \d+\)\]?) +(\d+) *(.*)",
                                             l) for l in lines) if m}
    assert set(rows) == {"a", "b", "joined", "total", "scaled"}, rows.keys()
    assert rows["joined"].group(2) == "Concatenate" and rows["joined"].group(4) == "0"
    assert rows["total"].group(4) == str(5 * 1 + 1) and rows["scaled"].group(4) == str(2 * 2 + 2)
    assert "joined" in rows["total"].group(5) and "a[0][0]" in rows["scaled"].group(5)
    assert "Total params: 12" in lines


# --- weights ----------------------------------------------------------------------------------

def check_weights_against(file, expected, extra=()):
    """`loadstar weights --json` of `file` against `expected`: [(layer, weight, array)]."""
    out, _ = run("weights", "--json", file, *extra)
    listed = json.loads(out)
    assert [(w["layer"], w["weight"]) for w in listed] == [(l, n) for l, n, _ in expected], \
        [(w["layer"], w["weight"]) for w in listed]
    for w, (layer, name, value) in zip(listed, expected):
        value = np.asarray(value, dtype=np.float32).astype(np.float64)
        what = f"{file}: {layer}/{name}"
        assert w["name"] == f"{layer}/{name}:0"
        assert tuple(w["shape"]) == value.shape, f"{what}: shape {w['shape']} != {value.shape}"
        assert w["dtype"] == "float32" and w["count"] == value.size
        assert w["nan"] == int(np.isnan(value).sum()), what
        assert w["inf"] == int(np.isinf(value).sum()), what
        finite = value[np.isfinite(value)]
        if finite.size == 0:
            assert w["min"] is None and w["mean"] is None, what
            continue
        close(w["min"], finite.min(), what + " min", rtol=0, atol=0)
        close(w["max"], finite.max(), what + " max", rtol=0, atol=0)
        close(w["mean"], finite.mean(), what + " mean", rtol=1e-9, atol=1e-12)
        close(w["std"], finite.std(), what + " std", rtol=1e-9, atol=1e-12)
    return listed


@case
def weights_lists_constant_weights_of_a_json_model():
    model = write_json("mlp.json", MLP_JSON)
    check_weights_against(model, [("hidden", "kernel", np.full((4, 3), 0.5)),
                                  ("hidden", "bias", np.full(3, 0.1)),
                                  ("out", "kernel", np.full((3, 2), -0.25)),
                                  ("out", "bias", np.zeros(2))])
    out, _ = run("weights", model)
    lines = out.splitlines()
    assert lines[0] == 'Model: "mlp"'
    assert lines[1].split() == ["Weight", "Shape", "DType", "Trainable", "Min", "Max", "Mean",
                                "Std", "NaN", "Inf"], lines[1]
    assert lines[3].split() == ["hidden/kernel:0", "(4,", "3)", "float32", "yes", "0.5", "0.5",
                                "0.5", "0", "0", "0"], lines[3]
    assert lines[4].split() == ["hidden/bias:0", "(3,)", "float32", "yes", "0.1", "0.1", "0.1",
                                "0", "0", "0"], lines[4]
    assert lines[-1] == "Total: 4 weights, 23 parameters"


@case
def weights_reports_statistics_nan_and_inf_of_an_h5_model():
    w = {k: [(n, np.array(v, dtype=np.float32)) for n, v in ws] for k, ws in CLF_W.items()}
    w["dense"][0][1][0, 0] = np.nan
    w["dense"][0][1][1, 2] = np.inf
    w["dense"][0][1][3, 3] = -np.inf
    w["dense_1"][1] = ("bias", np.array([np.nan, np.nan, np.nan], dtype=np.float32))
    file = write_keras_h5(path("nan.h5"), CLF_CONFIG, w)
    listed = check_weights_against(file, [(l, n, v) for l, ws in w.items() for n, v in ws])
    assert listed[0]["nan"] == 1 and listed[0]["inf"] == 2
    out, _ = run("weights", file)
    row = next(l for l in out.splitlines() if l.startswith("dense_1/bias:0"))
    assert row.split() == ["dense_1/bias:0", "(3,)", "float32", "yes", "-", "-", "-", "-", "3",
                           "0"], row
    assert out.splitlines()[-1] == "Total: 4 weights, 39 parameters"


# --- predict ----------------------------------------------------------------------------------

@case
def predict_reads_npy_of_any_dtype_and_writes_npy_h5_and_text():
    model = write_json("mlp.json", MLP_JSON)
    x = (np.arange(28).reshape(7, 4) % 9 - 3).astype(">f8")
    expected = mlp_reference(x)
    np.save(path("x_be.npy"), x)
    np.save(path("x_i2.npy"), x.astype("<i2"))
    for source in ["x_be.npy", "x_i2.npy"]:
        for batch in ["1", "3", "32"]:
            run("predict", model, "--input", path(source), "--batch-size", batch,
                "--output", path("y.npy"))
            y = np.load(path("y.npy"))
            assert y.dtype == np.float32, y.dtype
            close(y, expected, f"{source} batch {batch}")
    run("predict", model, "-i", path("x_be.npy"), "-o", path("y.h5"))
    with h5py.File(path("y.h5"), "r") as f:
        assert list(f.keys()) == ["out"], list(f.keys())
        close(f["out"][()], expected, "h5 output")
    out, err = run("predict", model, "-i", path("x_be.npy"))
    assert err == ""
    text = parse_text_outputs(out)
    assert list(text) == ["out"] and out.startswith("# out: shape (7, 2)\n"), out
    # The text is the shortest that reads back as the same float32: it is exact.
    assert np.array_equal(text["out"].astype(np.float32), np.load(path("y.npy"))), out


@case
def predict_reads_hdf5_datasets_including_integers():
    model = write_json("mlp.json", MLP_JSON)
    x = (np.arange(20).reshape(5, 4) % 7).astype(np.float32)
    with h5py.File(path("in.h5"), "w") as f:
        f["group/x"] = x
        f["ints"] = x.astype(np.uint8)
    for dataset in ["group/x", "/group/x", "ints"]:
        run("predict", model, "-i", path("in.h5"), "-d", dataset, "-o", path("y.npy"))
        close(np.load(path("y.npy")), mlp_reference(x), dataset)


@case
def predict_feeds_several_inputs_and_writes_several_outputs():
    model = write_json("two.json", functional_json())
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    b = np.arange(9, dtype=np.float32).reshape(3, 3) * -0.5
    total = np.concatenate([a, b], axis=1).sum(axis=1, keepdims=True)
    scaled = np.repeat(a.sum(axis=1, keepdims=True) * 2 + 1, 2, axis=1)
    np.save(path("a.npy"), a)
    np.save(path("b.npy"), b)
    with h5py.File(path("ab.h5"), "w") as f:
        f["a"] = a
        f["b"] = b
    runs = [["-i", path("a.npy"), "-i", path("b.npy")],
            ["-i", path("ab.h5"), "-d", "a", "-d", "b"],
            ["-i", path("ab.h5"), "-d", "a", "-i", path("b.npy")]]
    for inputs in runs:
        run("predict", model, *inputs, "-o", path("y.h5"))
        with h5py.File(path("y.h5"), "r") as f:
            assert sorted(f.keys()) == ["scaled", "total"], list(f.keys())
            close(f["total"][()], total, f"total {inputs}")
            close(f["scaled"][()], scaled, f"scaled {inputs}")
    run("predict", model, *runs[0], "-o", path("named.h5"), "--output-dataset", "p/t",
        "--output-dataset", "p/s")
    with h5py.File(path("named.h5"), "r") as f:
        close(f["p/t"][()], total, "renamed total")
        close(f["p/s"][()], scaled, "renamed scaled")
    out, _ = run("predict", model, *runs[0])
    text = parse_text_outputs(out)
    close(text["total"], total, "text total")
    close(text["scaled"], scaled, "text scaled")
    run_error(["predict", model, *runs[0], "-o", path("y.npy")], 1,
              "has 2 outputs but an .npy file holds one array")


@case
def predict_runs_an_h5_model_with_random_weights():
    model = classifier_h5()
    x = RNG.normal(size=(40, 5)).astype(np.float32)
    np.save(path("clf_x.npy"), x)
    run("predict", model, "-i", path("clf_x.npy"), "-o", path("clf_y.npy"), "-b", "16")
    close(np.load(path("clf_y.npy")), clf_reference(x), "classifier")


# --- convert ----------------------------------------------------------------------------------

def predictions(model, x_file):
    out_file = path("round_trip_y.npy")
    run("predict", model, "-i", x_file, "-o", out_file)
    return np.load(out_file)


@case
def convert_round_trip_keeps_predictions_and_weights():
    source = classifier_h5()
    x = RNG.normal(size=(9, 5)).astype(np.float32)
    np.save(path("rt_x.npy"), x)
    before = predictions(source, path("rt_x.npy"))
    close(before, clf_reference(x), "before conversion")
    weights_before = json.loads(run("weights", "--json", source)[0])
    run("convert", source, path("clf.keras"))
    assert zipfile.is_zipfile(path("clf.keras")), "a .keras file is a zip archive"
    names = zipfile.ZipFile(path("clf.keras")).namelist()
    assert "config.json" in names and "model.weights.h5" in names, names
    run("convert", path("clf.keras"), path("clf_back.h5"))
    assert h5py.is_hdf5(path("clf_back.h5"))
    with h5py.File(path("clf_back.h5"), "r") as f:
        assert "model_config" in f.attrs and "model_weights" in f
    for converted in [path("clf.keras"), path("clf_back.h5")]:
        after = predictions(converted, path("rt_x.npy"))
        assert np.array_equal(after, before), f"{converted}: predictions changed"
        assert json.loads(run("weights", "--json", converted)[0]) == weights_before, converted
        assert run("summary", converted)[0] == run("summary", source)[0], converted


@case
def convert_writes_a_json_architecture_as_a_model_file():
    model = write_json("mlp.json", MLP_JSON)
    np.save(path("mlp_x.npy"), np.ones((2, 4), dtype=np.float32))
    run("convert", model, path("mlp.h5"))
    close(predictions(path("mlp.h5"), path("mlp_x.npy")), mlp_reference(np.ones((2, 4))),
          "converted json")
    with h5py.File(path("mlp.h5"), "r") as f:
        config = json.loads(f.attrs["model_config"])
        assert config["class_name"] == "Sequential", config


@case
def convert_without_optimizer_skips_a_training_config_it_cannot_compile():
    with h5py.File(write_keras_h5(path("odd_ok.h5"), CLF_CONFIG, CLF_W), "a") as f:
        f.attrs["training_config"] = json.dumps(
            {"loss": "mse", "metrics": [],
             "optimizer_config": {"class_name": "Frobnicator", "config": {}}}).encode()
    run("convert", "--no-optimizer", path("odd_ok.h5"), path("odd_ok.keras"))
    x = RNG.normal(size=(3, 5)).astype(np.float32)
    np.save(path("odd_x.npy"), x)
    close(predictions(path("odd_ok.keras"), path("odd_x.npy")), clf_reference(x), "converted")


# --- Keras-written fixtures -------------------------------------------------------------------

def keras_weights(file):
    """[(layer, weight, array)] of a Keras 2 whole-model or save_weights file, read with h5py."""
    out = []
    with h5py.File(file, "r") as f:
        g = f["model_weights"] if "model_weights" in f else f
        for layer in g.attrs["layer_names"]:
            layer = layer.decode() if isinstance(layer, bytes) else layer
            for name in g[layer].attrs["weight_names"]:
                name = name.decode() if isinstance(name, bytes) else name
                short = name.split("/")[-1].split(":")[0]
                out.append((layer, short, g[layer][name][()]))
    return out


@case
def fixture_predictions_match_keras():
    model = require_fixture("dl4j_simple_sparse_xent_mlp_keras_2_model.h5")
    data = require_fixture("dl4j_simple_sparse_xent_mlp_keras_2_inputs_and_outputs.h5")
    with h5py.File(data, "r") as f:
        expected = f["predictions/activation_1"][()]
    run("predict", model, "-i", data, "-d", "inputs/dense_1_input", "-o", path("fx.npy"))
    close(np.load(path("fx.npy")), expected, "simple_sparse_xent vs Keras", rtol=1e-5, atol=1e-6)


@case
def fixture_architecture_json_with_weights_file_matches_keras():
    config = require_fixture("dl4j_mnist_mlp_tf_keras_2_config.json")
    weights = require_fixture("dl4j_mnist_mlp_tf_keras_2_weights.h5")
    data = require_fixture("dl4j_mnist_mlp_tf_keras_2_inputs_and_outputs.h5")
    with h5py.File(data, "r") as f:
        expected = f["predictions/dense_3"][()]
    run("predict", config, "--weights", weights, "-i", data, "-d", "inputs/dense_1_input",
        "-o", path("mnist.npy"))
    close(np.load(path("mnist.npy")), expected, "mnist_mlp vs Keras", rtol=1e-4, atol=1e-6)
    check_weights_against(config, keras_weights(weights), extra=["--weights", weights])


@case
def fixture_weights_and_summary_match_the_files():
    # Left out: hls4ml_conv2d_1layer.h5, whose Conv2D names a Python function as its
    # kernel_initializer, which the layer registry refuses.
    names = ["dl4j_simple_sparse_xent_mlp_keras_2_model.h5",
             "hls4ml_mlp_streaming_keras_model.keras", "purinat33_mnist_cnn_keras2.10.h5",
             "dl4j_cnn_batch_norm.h5", "dl4j_tfkeras_issue_9349.hdf5", "dl4j_simpleconv2d.hdf5"]
    found = 0
    for name in names:
        try:
            file = require_fixture(name)
        except Skip:
            continue
        found += 1
        expected = keras_weights(file)
        check_weights_against(file, expected)
        out, _ = run("summary", file)
        total = sum(v.size for _, _, v in expected)
        assert f"Total params: {total:,}" in out.splitlines(), f"{name}: {out}"
    if found == 0:
        raise Skip("no fixture file is present")


def optimizer_weights(file):
    """{name: array} of a legacy HDF5 file's /optimizer_weights (empty when it has none)."""
    with h5py.File(file, "r") as f:
        if "optimizer_weights" not in f:
            return {}
        g = f["optimizer_weights"]
        names = [n.decode() if isinstance(n, bytes) else n for n in g.attrs["weight_names"]]
        return {n: g[n][()] for n in names}


@case
def fixture_convert_keeps_the_optimizer_state_unless_told_not_to():
    source = require_fixture("purinat33_mnist_cnn_keras2.10.h5")
    expected = optimizer_weights(source)
    assert len(expected) == 25 and "Adam/iter:0" in expected
    run("convert", source, path("cnn.keras"))
    run("convert", path("cnn.keras"), path("cnn.h5"))
    back = optimizer_weights(path("cnn.h5"))
    assert list(back) == list(expected), list(back)
    for name, value in expected.items():
        assert back[name].dtype == value.dtype and np.array_equal(back[name], value), name
    with h5py.File(path("cnn.h5"), "r") as f:
        assert json.loads(f.attrs["training_config"])["optimizer_config"]["class_name"] == "Adam"
    run("convert", "--no-optimizer", source, path("cnn_bare.h5"))
    assert optimizer_weights(path("cnn_bare.h5")) == {}
    with h5py.File(path("cnn_bare.h5"), "r") as f:
        assert "training_config" not in f.attrs
    x = np.random.default_rng(3).uniform(0, 1, (4, 28, 28, 1)).astype(np.float32)
    np.save(path("cnn_x.npy"), x)
    first = predictions(source, path("cnn_x.npy"))
    for converted in ["cnn.keras", "cnn.h5", "cnn_bare.h5"]:
        assert np.array_equal(predictions(path(converted), path("cnn_x.npy")), first), converted


def main():
    failed = 0
    skipped = 0
    for f in CASES:
        try:
            f()
            print(f"ok    {f.__name__}")
        except Skip as s:
            skipped += 1
            print(f"skip  {f.__name__}: {s}")
        except Exception:  # noqa: BLE001 - every failure is reported, then the next case runs
            failed += 1
            print(f"FAIL  {f.__name__}:\n{traceback.format_exc()}")
    print(f"{len(CASES) - failed - skipped} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        status = main()
    finally:
        subprocess.run(["rm", "-rf", WORK], check=False)
    sys.exit(status)
