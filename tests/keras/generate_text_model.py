#!/usr/bin/python3
"""Reference values for models of a string input (tests/keras/test_text_model.cpp).

Keras's end-to-end text model, `keras.Model(text, model(vectorize(text)))` with
`text = keras.Input(shape=(1,), dtype="string")`, computed independently of loadstar: the
TextVectorization from Keras's published algorithm (generate_text_vectorization.py's NumPy
implementation, adapted on CORPUS), the layers after it in PyTorch (nn.Embedding, mean over the
steps, nn.Linear; cross-entropy; SGD). Keras's layer pads each batch of an `int` layer without
`output_sequence_length` to its longest text, so `predict` and `evaluate` are computed per batch.

Also writes reference/text_model_keras3.keras: a `.keras` archive laid out as Keras 3's
saving_lib writes one (config.json with `__keras_tensor__` arguments, model.weights.h5 with
`layers/<key>/vars`, the vocabulary as `assets/layers/text_vectorization/vocabulary.txt`), built
here with zipfile and h5py from what Keras 3's source writes, for the reader's conformance.

Usage: /usr/bin/python3 tests/keras/generate_text_model.py > tests/keras/reference/text_model.json
"""
import io
import json
import os
import sys
import zipfile

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate_text_vectorization as tv  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

TEXTS = [
    "the fox and the cat",
    "a dog barks",
    "unseen words only here",
    "Dog! dog? DOG.",
    "fox jumps over the lazy dog and the quick brown cat",
    "",
    "cat",
]
LABELS = [0, 1, 2, 1, 0, 2, 1]

CASES = [
    # name, TextVectorization options, Embedding width (None: none), classes
    ("int_fixed", dict(output_mode="int", max_tokens=20, output_sequence_length=6), 4, 3),
    ("int_ragged", dict(output_mode="int", max_tokens=20), 4, 3),
    ("multi_hot", dict(output_mode="multi_hot", max_tokens=12), None, 3),
    ("tf_idf", dict(output_mode="tf_idf"), None, 3),
]
BATCH = 3


def options(c):
    o = dict(standardize="lower_and_strip_punctuation", split="whitespace", ngrams=None)
    o.update(c)
    return o


def weights(rng, shape):
    return (rng.standard_normal(shape) * 0.5).astype(np.float32)


def forward(ids_or_rows, emb, kernel, bias):
    x = torch.tensor(ids_or_rows)
    if emb is not None:
        x = torch.nn.functional.embedding(x, torch.tensor(emb)).mean(dim=1)
    return x @ torch.tensor(kernel) + torch.tensor(bias)


def case(name, c, width, classes, seed):
    o = options(c)
    vocab, idf = tv.adapt(tv.CORPUS, o)
    start = 2 if o["output_mode"] == "int" else 1
    depth = o["max_tokens"] if o.get("pad_to_max_tokens") else start + len(vocab)
    rng = np.random.default_rng(seed)
    emb = weights(rng, (o["max_tokens"], width)) if width else None
    features = width if width else depth
    kernel, bias = weights(rng, (features, classes)), weights(rng, (classes,))
    # predict and evaluate: batches of BATCH texts, each vectorized on its own.
    outputs, losses = [], []
    for b in range(0, len(TEXTS), BATCH):
        rows = tv.call(TEXTS[b:b + BATCH], vocab, idf, o)
        logits = forward(rows, emb, kernel, bias)
        outputs.append(logits)
        losses.append(torch.nn.functional.cross_entropy(
            logits, torch.tensor(LABELS[b:b + BATCH]), reduction="none"))
    logits = torch.cat(outputs)
    loss = torch.cat(losses).mean()
    accuracy = (logits.argmax(1) == torch.tensor(LABELS)).float().mean()
    out = {
        "name": name, "options": o, "width": width, "classes": classes,
        "vocabulary": (["", "[UNK]"] if start == 2 else ["[UNK]"]) +
                      [t.decode("utf-8") for t in vocab],
        "idf_weights": None if idf is None else [float(x) for x in idf],
        "embedding": None if emb is None else emb.tolist(),
        "kernel": kernel.tolist(), "bias": bias.tolist(),
        "predict": logits.tolist(), "loss": float(loss), "accuracy": float(accuracy),
    }
    if o["output_mode"] != "int" or o.get("output_sequence_length"):
        # fit(texts, labels, batch_size=BATCH, shuffle=False, epochs=2), SGD(0.1): the texts
        # vectorized once (rows of one length), the same batches every epoch.
        params = [torch.tensor(kernel, requires_grad=True), torch.tensor(bias, requires_grad=True)]
        if emb is not None:
            params.append(torch.tensor(emb, requires_grad=True))
        sgd = torch.optim.SGD(params, lr=0.1)
        rows = tv.call(TEXTS, vocab, idf, o)
        for _ in range(2):
            for b in range(0, len(TEXTS), BATCH):
                x = torch.tensor(rows[b:b + BATCH])
                if emb is not None:
                    x = torch.nn.functional.embedding(x, params[2]).mean(dim=1)
                logits = x @ params[0] + params[1]
                loss = torch.nn.functional.cross_entropy(logits, torch.tensor(LABELS[b:b + BATCH]))
                sgd.zero_grad()
                loss.backward()
                sgd.step()
        with torch.no_grad():
            x = torch.tensor(rows)
            if emb is not None:
                x = torch.nn.functional.embedding(x, params[2]).mean(dim=1)
            out["fit_predict"] = (x @ params[0] + params[1]).tolist()
    return out


def keras3_archive(c):
    """A .keras archive of the int_fixed model as Keras 3's saving_lib lays one out."""
    o = options(c["options"])
    vocabulary = c["vocabulary"]

    def tensor(shape, dtype, layer):
        return {"class_name": "__keras_tensor__",
                "config": {"shape": shape, "dtype": dtype, "keras_history": [layer, 0, 0]}}

    def policy(name):
        return {"module": "keras", "class_name": "DTypePolicy", "config": {"name": name},
                "registered_name": None}

    length = o["output_sequence_length"]
    layers = [
        {"module": "keras.layers", "class_name": "InputLayer",
         "config": {"batch_shape": [None, 1], "dtype": "string", "sparse": False,
                    "ragged": False, "name": "text"},
         "registered_name": None, "name": "text", "inbound_nodes": []},
        {"module": "keras.layers", "class_name": "TextVectorization",
         "config": {"name": "text_vectorization", "trainable": True, "dtype": policy("float32"),
                    "max_tokens": o["max_tokens"], "standardize": o["standardize"],
                    "split": o["split"], "ngrams": None, "output_mode": "int",
                    "output_sequence_length": length, "pad_to_max_tokens": False,
                    "sparse": False, "ragged": False, "vocabulary": None, "idf_weights": None,
                    "encoding": "utf-8", "vocabulary_size": len(vocabulary)},
         "registered_name": None, "name": "text_vectorization",
         "inbound_nodes": [{"args": [tensor([None, 1], "string", "text")], "kwargs": {}}]},
        {"module": "keras.layers", "class_name": "Embedding",
         "config": {"name": "embedding", "trainable": True, "dtype": policy("float32"),
                    "input_dim": o["max_tokens"], "output_dim": c["width"],
                    "embeddings_initializer": {"module": "keras.initializers",
                                               "class_name": "RandomUniform",
                                               "config": {"minval": -0.05, "maxval": 0.05,
                                                          "seed": None},
                                               "registered_name": None},
                    "embeddings_regularizer": None, "activity_regularizer": None,
                    "embeddings_constraint": None, "mask_zero": False},
         "registered_name": None, "build_config": {"input_shape": [None, length]},
         "name": "embedding",
         "inbound_nodes": [{"args": [tensor([None, length], "int64", "text_vectorization")],
                            "kwargs": {}}]},
        {"module": "keras.layers", "class_name": "GlobalAveragePooling1D",
         "config": {"name": "pool", "trainable": True, "dtype": policy("float32"),
                    "data_format": "channels_last", "keepdims": False},
         "registered_name": None, "build_config": {"input_shape": [None, length, c["width"]]},
         "name": "pool",
         "inbound_nodes": [{"args": [tensor([None, length, c["width"]], "float32", "embedding")],
                            "kwargs": {"mask": None}}]},
        {"module": "keras.layers", "class_name": "Dense",
         "config": {"name": "logits", "trainable": True, "dtype": policy("float32"),
                    "units": c["classes"], "activation": "linear", "use_bias": True,
                    "kernel_initializer": {"module": "keras.initializers",
                                           "class_name": "GlorotUniform",
                                           "config": {"seed": None}, "registered_name": None},
                    "bias_initializer": {"module": "keras.initializers", "class_name": "Zeros",
                                         "config": {}, "registered_name": None},
                    "kernel_regularizer": None, "bias_regularizer": None,
                    "kernel_constraint": None, "bias_constraint": None},
         "registered_name": None, "build_config": {"input_shape": [None, c["width"]]},
         "name": "logits",
         "inbound_nodes": [{"args": [tensor([None, c["width"]], "float32", "pool")],
                            "kwargs": {}}]},
    ]
    config = {"module": "keras", "class_name": "Functional",
              "config": {"name": "end_to_end", "trainable": True, "layers": layers,
                         "input_layers": [["text", 0, 0]], "output_layers": [["logits", 0, 0]]},
              "registered_name": "Functional", "build_config": {"input_shape": None}}
    weights_file = io.BytesIO()
    with h5py.File(weights_file, "w") as h5:
        h5.create_group("vars")
        for key in ["input_layer", "text_vectorization", "text_vectorization/_lookup_layer",
                    "global_average_pooling1d"]:
            h5.create_group("layers/" + key + "/vars")
        h5.create_dataset("layers/embedding/vars/0", data=np.float32(c["embedding"]))
        h5.create_dataset("layers/dense/vars/0", data=np.float32(c["kernel"]))
        h5.create_dataset("layers/dense/vars/1", data=np.float32(c["bias"]))
    vocabulary_text = "\n".join(vocabulary)
    path = os.path.join(HERE, "reference", "text_model_keras3.keras")
    members = [
        ("metadata.json", json.dumps({"keras_version": "3.6.0", "date_saved": ""})),
        ("config.json", json.dumps(config)),
        ("model.weights.h5", weights_file.getvalue()),
        ("assets/layers/text_vectorization/vocabulary.txt", vocabulary_text),
        ("assets/layers/text_vectorization/_lookup_layer/vocabulary.txt", vocabulary_text),
    ]
    with zipfile.ZipFile(path + ".tmp", "w") as zf:
        for name, data in members:
            zf.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data)
    os.replace(path + ".tmp", path)


def main():
    torch.manual_seed(0)
    cases = [case(name, c, width, classes, seed)
             for seed, (name, c, width, classes) in enumerate(CASES)]
    keras3_archive(cases[0])
    print(json.dumps({"texts": TEXTS, "labels": LABELS, "batch_size": BATCH,
                      "corpus": tv.CORPUS, "cases": cases}, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
