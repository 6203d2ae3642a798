#!/usr/bin/python3
"""Reads loadstar's TensorBoard event files with TensorFlow's and TensorBoard's own definitions.

    check_events.py --writer build/h/tests/tensorboard/tensorboard_write_events \
                    --proto-dir tests/tensorboard/proto
    check_events.py --ours DIR --proto-dir tests/tensorboard/proto   # files written earlier

The .proto files under --proto-dir (TensorFlow's event.proto, summary.proto, tensor.proto, ...
and TensorBoard's hparams api.proto and plugin_data.proto, see its MANIFEST) are compiled with
`protoc --python_out` into a temporary folder, independently of the definitions loadstar embeds.
Every record's framing and both masked CRC-32Cs are checked (with a CRC written here), every
Event is decoded, and the scalars are compared with what the writer recorded: the History and
the batch logs for keras::callbacks::TensorBoard, metrics.jsonl for trials (float32, as
`simple_value` holds them). A folder is read as TensorBoard reads it: files in name order, a
SessionLog START dropping the events read before at its step and later. Exits 77 (Meson's
"skipped") without protoc or python3-protobuf.
"""

import argparse
import glob
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

SKIP = 77

try:
    import google.protobuf  # noqa: F401
except ImportError as error:
    print(f"skipped: google.protobuf is not importable by {sys.executable} ({error})")
    sys.exit(SKIP)

FAILURES = []


def fail(message):
    FAILURES.append(message)
    print("FAIL:", message)


def check(condition, message):
    if not condition:
        fail(message)
    return condition


# --- CRC-32C and TFRecord framing -------------------------------------------------------------

def _crc_table():
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


CRC_TABLE = _crc_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283


def read_records(path):
    """The records of a TFRecord file; every length and CRC checked."""
    data = open(path, "rb").read()
    records = []
    at = 0
    while at < len(data):
        if not check(len(data) - at >= 12, f"{path}: a record header is cut at byte {at}"):
            break
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        check(length_crc == masked_crc32c(header),
              f"{path}: record at byte {at}: length CRC {length_crc:#x}, expected "
              f"{masked_crc32c(header):#x}")
        end = at + 12 + length
        if not check(end + 4 <= len(data), f"{path}: record at byte {at} is cut"):
            break
        body = data[at + 12:end]
        (data_crc,) = struct.unpack("<I", data[end:end + 4])
        check(data_crc == masked_crc32c(body),
              f"{path}: record at byte {at}: data CRC {data_crc:#x}, expected "
              f"{masked_crc32c(body):#x}")
        records.append(body)
        at = end + 4
    return records


# --- TensorFlow's and TensorBoard's definitions -------------------------------------------------

def compile_protos(proto_dir, out_dir):
    protoc = shutil.which("protoc")
    if protoc is None:
        print("skipped: protoc is not on the PATH (Debian's protobuf-compiler)")
        sys.exit(SKIP)
    files = sorted(os.path.relpath(p, proto_dir)
                   for p in glob.glob(os.path.join(proto_dir, "**", "*.proto"), recursive=True))
    os.makedirs(out_dir, exist_ok=True)
    subprocess.run([protoc, f"-I{proto_dir}", f"--python_out={out_dir}"] + files, check=True)
    sys.path.insert(0, out_dir)
    from tensorflow.core.util import event_pb2
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorflow.core.framework import types_pb2
    return event_pb2, plugin_data_pb2, types_pb2


# --- reading folders as TensorBoard does ----------------------------------------------------------

def event_files(folder):
    names = sorted(n for n in os.listdir(folder) if n.startswith("events.out.tfevents."))
    for name in names:
        check(re.fullmatch(r"events\.out\.tfevents\.\d{10}\.[^/]+", name) is not None,
              f"{folder}: file name '{name}' is not TensorFlow's")
    return [os.path.join(folder, n) for n in names]


def read_events(path, event_pb2):
    events = [event_pb2.Event.FromString(r) for r in read_records(path)]
    check(events and events[0].WhichOneof("what") == "file_version" and
          events[0].file_version == "brain.Event:2",
          f"{path}: the first event is not file_version brain.Event:2")
    return events


class Run:
    """A folder's summaries after TensorBoard's purge of restarted sessions."""

    def __init__(self, folder, event_pb2):
        self.files = event_files(folder)
        self.events = []  # (file index, event), purged
        self.unpurged = []
        for index, path in enumerate(self.files):
            for event in read_events(path, event_pb2):
                self.unpurged.append((index, event))
                if (event.WhichOneof("what") == "session_log" and
                        event.session_log.status == event_pb2.SessionLog.START):
                    self.events = [(i, e) for i, e in self.events if e.step < event.step]
                self.events.append((index, event))

    def values(self, unpurged=False):
        for _, event in (self.unpurged if unpurged else self.events):
            if event.WhichOneof("what") == "summary":
                for value in event.summary.value:
                    yield event.step, value

    def scalars(self, prefix="", unpurged=False):
        table = {}
        for step, value in self.values(unpurged):
            if value.WhichOneof("value") == "simple_value" and value.tag.startswith(prefix):
                table.setdefault(value.tag, []).append((step, value.simple_value))
        return {tag: sorted(points) for tag, points in table.items()}


def f32(value):
    return struct.unpack("<f", struct.pack("<f", value))[0]


def same(a, b):
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and
                      math.isnan(b))


def compare(owner, got, expected):
    """got, expected: {tag: [(step, value)]}."""
    for tag in sorted(set(got) | set(expected)):
        g, e = got.get(tag, []), expected.get(tag, [])
        if not check(len(g) == len(e) and all(gs == es and same(gv, ev)
                                              for (gs, gv), (es, ev) in zip(g, e)),
                     f"{owner}: tag '{tag}': found {g[:6]}{'...' if len(g) > 6 else ''}, "
                     f"expected {e[:6]}{'...' if len(e) > 6 else ''}"):
            continue


# --- keras::callbacks::TensorBoard --------------------------------------------------------------

def check_callback(folder, event_pb2, types_pb2):
    owner = f"callback '{folder}'"
    history = json.load(open(os.path.join(folder, "history.json")))
    batches = json.load(open(os.path.join(folder, "batches.json")))
    train = Run(os.path.join(folder, "train"), event_pb2)
    validation = Run(os.path.join(folder, "validation"), event_pb2)
    check(len(train.files) == 1 and len(validation.files) == 1,
          f"{owner}: expected one event file in train and in validation, found "
          f"{len(train.files)} and {len(validation.files)}")

    epochs = history["epoch"]
    logs = history["history"]
    expected_train, expected_validation = {}, {}
    for name, values in logs.items():
        if name.startswith("val_"):
            expected_validation["epoch_" + name[4:]] = [(e, f32(v)) for e, v in zip(epochs, values)]
        else:
            expected_train["epoch_" + name] = [(e, f32(v)) for e, v in zip(epochs, values)]
    got = train.scalars("epoch_")
    check(len(got.get("epoch_learning_rate", [])) == len(epochs),
          f"{owner}: expected epoch_learning_rate at every epoch, found "
          f"{got.get('epoch_learning_rate')}")
    got.pop("epoch_learning_rate", None)
    check(set(expected_train) >= {"epoch_loss", "epoch_accuracy"},
          f"{owner}: the History holds no loss and accuracy: {sorted(logs)}")
    compare(owner + " train", got, expected_train)
    compare(owner + " validation", validation.scalars("epoch_"), expected_validation)

    # update_freq 2: every second batch, at the batch's count since fit began.
    expected_batches = {}
    for count, line in batches.items():
        if int(count) % 2 == 0:
            for name, value in line.items():
                expected_batches.setdefault("batch_" + name, []).append((int(count), f32(value)))
    check(len(expected_batches.get("batch_loss", [])) >= 3,
          f"{owner}: expected batch losses, found {expected_batches.get('batch_loss')}")
    compare(owner + " train batches", train.scalars("batch_"),
            {t: sorted(p) for t, p in expected_batches.items()})

    # evaluation_<name>_vs_iterations at the optimizer's iterations after each epoch.
    per_epoch = len(batches) // len(epochs)
    expected_evaluation = {}
    for name, values in logs.items():
        if name.startswith("val_"):
            expected_evaluation[f"evaluation_{name[4:]}_vs_iterations"] = [
                ((e + 1) * per_epoch, f32(v)) for e, v in zip(epochs, values)]
    compare(owner + " evaluation", validation.scalars("evaluation_"), expected_evaluation)

    # Weight histograms every epoch, with TensorFlow's default buckets.
    sizes = {"hidden/kernel": 16, "hidden/bias": 8, "logits/kernel": 16, "logits/bias": 2}
    histograms = {}
    for step, value in train.values():
        if value.WhichOneof("value") == "histo":
            histograms.setdefault(value.tag, []).append((step, value.histo))
    check(sorted(histograms) == sorted(f"{w}/histogram" for w in sizes),
          f"{owner}: histogram tags {sorted(histograms)}")
    for weight, size in sizes.items():
        series = histograms.get(f"{weight}/histogram", [])
        check([s for s, _ in series] == list(epochs),
              f"{owner}: histogram of {weight} at steps {[s for s, _ in series]}")
        for step, histo in series:
            check(histo.num == size and sum(histo.bucket) == size and
                  histo.min <= histo.max and len(histo.bucket) == len(histo.bucket_limit) and
                  list(histo.bucket_limit) == sorted(histo.bucket_limit) and
                  histo.min <= histo.sum / size <= histo.max,
                  f"{owner}: histogram of {weight} at {step}: {histo}")

    # write_graph: the model's Keras config for the graph dashboard.
    graphs = [(s, v) for s, v in train.values() if v.tag == "keras"]
    if check(len(graphs) == 1, f"{owner}: expected one 'keras' graph summary, found {len(graphs)}"):
        step, value = graphs[0]
        check(step == 0 and value.metadata.plugin_data.plugin_name == "graph_keras_model" and
              value.metadata.plugin_data.content == b"1" and
              value.tensor.dtype == types_pb2.DT_STRING and
              json.loads(value.tensor.string_val[0])["class_name"] == "Sequential",
              f"{owner}: the 'keras' graph summary is not Keras's: {value}")


# --- trials ------------------------------------------------------------------------------------

def validation_tag(name):
    return "Determined/" + (name if name.startswith("val") else "val_" + name)


def check_trial(folder, event_pb2, plugin_data_pb2, files, start_step):
    """`folder` holds trial/ (metrics.jsonl, tensorboard/); `files` event files expected, the later
    ones beginning with a SessionLog START at `start_step`."""
    trial_dir = os.path.join(folder, "trial")
    owner = f"trial '{trial_dir}'"
    run = Run(os.path.join(trial_dir, "tensorboard"), event_pb2)
    check(len(run.files) == files, f"{owner}: expected {files} event files, found {len(run.files)}")
    for path in run.files[1:]:
        events = read_events(path, event_pb2)
        check(len(events) > 1 and events[1].WhichOneof("what") == "session_log" and
              events[1].session_log.status == event_pb2.SessionLog.START and
              events[1].step == start_step,
              f"{path}: expected a SessionLog START at step {start_step} after file_version, "
              f"found {events[1] if len(events) > 1 else 'nothing'}")

    expected = {}
    for line in open(os.path.join(trial_dir, "metrics.jsonl")):
        line = json.loads(line)
        for name, value in line["metrics"].items():
            tag = validation_tag(name) if line["kind"] == "validation" else "Determined/" + name
            expected.setdefault(tag, []).append((line["batches"], f32(value)))
    check({"Determined/loss", "Determined/val_loss"} <= set(expected),
          f"{owner}: metrics.jsonl has no loss and val_loss: {sorted(expected)}")
    scalars = run.scalars("Determined/")
    compare(owner, scalars, {t: sorted(p) for t, p in expected.items()})

    # The hyperparameters through the hparams plugin.
    record = json.load(open(os.path.join(trial_dir, "trial.json")))
    hparams = {}
    for step, value in run.values():
        if value.tag.startswith("_hparams_/"):
            check(value.metadata.plugin_data.plugin_name == "hparams",
                  f"{owner}: {value.tag} is not the hparams plugin's")
            data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
            check(data.version == 0, f"{owner}: {value.tag}: plugin data version {data.version}")
            hparams[value.tag] = data
    start = hparams.get("_hparams_/session_start_info")
    if check(start is not None, f"{owner}: no _hparams_/session_start_info"):
        got = {}
        for name, v in start.session_start_info.hparams.items():
            got[name] = getattr(v, v.WhichOneof("kind"))
        check(got == record["hparams"],
              f"{owner}: session_start_info hparams {got}, expected {record['hparams']}")
    experiment = hparams.get("_hparams_/experiment")
    if check(experiment is not None, f"{owner}: no _hparams_/experiment"):
        infos = experiment.experiment
        check(sorted(i.name for i in infos.hparam_infos) == sorted(record["hparams"]),
              f"{owner}: experiment hparam_infos {[i.name for i in infos.hparam_infos]}")
        check([m.name.tag for m in infos.metric_infos] == ["Determined/val_loss"],
              f"{owner}: experiment metric_infos {list(infos.metric_infos)}")
    return run


def check_trials(folder, event_pb2, plugin_data_pb2):
    full = check_trial(os.path.join(folder, "full"), event_pb2, plugin_data_pb2, 1, None)
    continued = check_trial(os.path.join(folder, "continued"), event_pb2, plugin_data_pb2, 2, 20)
    killed = check_trial(os.path.join(folder, "killed"), event_pb2, plugin_data_pb2, 3, 20)
    reference = full.scalars("Determined/")
    compare("continued trial against the uninterrupted one", continued.scalars("Determined/"),
            reference)
    compare("resumed trial against the uninterrupted one", killed.scalars("Determined/"),
            reference)
    # Without the START's purge the resumed trial's folder would hold the dropped run's events
    # too (so that the comparison above can fail).
    check(killed.scalars("Determined/", unpurged=True) != reference,
          "the resumed trial's earlier files hold no events past its checkpoint")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--writer", help="the tensorboard_write_events executable")
    source.add_argument("--ours", help="a folder the writer wrote earlier")
    parser.add_argument("--proto-dir", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loadstar-tensorboard-") as temp:
        event_pb2, plugin_data_pb2, types_pb2 = compile_protos(args.proto_dir,
                                                               os.path.join(temp, "py"))
        folder = args.ours
        if args.writer:
            folder = os.path.join(temp, "out")
            subprocess.run([args.writer, folder], check=True)
        check_callback(os.path.join(folder, "callback"), event_pb2, types_pb2)
        check_trials(os.path.join(folder, "trials"), event_pb2, plugin_data_pb2)
    if FAILURES:
        print(f"{len(FAILURES)} checks failed")
        return 1
    print("all event files read back as written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
