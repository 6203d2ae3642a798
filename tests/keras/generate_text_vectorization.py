#!/usr/bin/python3
"""Reference values for TextVectorization (tests/keras/test_text_vectorization.cpp).

Keras's TextVectorization computed in Python and NumPy from Keras's published algorithm
(keras/src/layers/preprocessing/text_vectorization.py and index_lookup.py): tf.strings.lower
(ASCII), Keras's strip regex verbatim, tf.strings.split (ASCII whitespace runs),
tf.strings.unicode_split with U+FFFD for ill-formed bytes (Python's replacing decoder),
tf.strings.ngrams joined by a space, the vocabulary sorted with NumPy's lexsort on (tokens, counts)
reversed, and idf = log(1 + documents / (1 + document count)) in float64, cast to float32, the OOV
entry the float32 mean.

Usage: /usr/bin/python3 tests/keras/generate_text_vectorization.py > tests/keras/reference/text_vectorization.json
"""
import json
import re

import numpy as np

STRIP = re.compile(rb'[!"#$%&()\*\+,-\./:;<=>?@\[\\\]^_`{|}~\']')
SPACE = re.compile(rb"[ \t\n\v\f\r]+")


def standardize(text, mode):
    if mode in ("lower", "lower_and_strip_punctuation"):
        text = text.lower()  # bytes.lower(): ASCII only, as tf.strings.lower without an encoding
    if mode in ("strip_punctuation", "lower_and_strip_punctuation"):
        text = STRIP.sub(b"", text)
    return text


def tokenize(text, o):
    text = standardize(text.encode("utf-8", "surrogateescape"), o["standardize"])
    if o["split"] == "whitespace":
        tokens = [t for t in SPACE.split(text) if t]
    elif o["split"] == "character":
        tokens = [c.encode("utf-8") for c in text.decode("utf-8", "replace")]
    else:
        tokens = [text]
    if not o["ngrams"]:
        return tokens
    grams = []
    for width in o["ngrams"]:
        for i in range(len(tokens) - width + 1):
            grams.append(b" ".join(tokens[i:i + width]))
    return grams


def adapt(documents, o):
    counts, doc_counts = {}, {}
    for d in documents:
        tokens = tokenize(d, o)
        for t in tokens:
            counts[t] = counts.get(t, 0) + 1
        for t in set(tokens):
            doc_counts[t] = doc_counts.get(t, 0) + 1
    counts.pop(b"", None)
    counts.pop(b"[UNK]", None)
    tokens = np.array(list(counts.keys()), dtype=object)
    values = np.array(list(counts.values()), dtype=np.int64)
    order = np.lexsort((tokens, values))[::-1] if len(tokens) else np.array([], dtype=np.int64)
    start = 2 if o["output_mode"] == "int" else 1
    if o.get("max_tokens"):
        order = order[: o["max_tokens"] - start]
    vocab = [tokens[i] for i in order]
    idf = None
    if o["output_mode"] == "tf_idf":
        df = np.array([doc_counts[t] for t in vocab], dtype=np.int64)
        w = np.log(1 + len(documents) / (1 + df)).astype(np.float32)
        mean = np.float32(np.mean(w, dtype=np.float32))
        idf = np.concatenate([np.full(start, mean, np.float32), w])
        if o.get("pad_to_max_tokens") and o.get("max_tokens"):
            idf = np.pad(idf, (0, o["max_tokens"] - len(idf)))
    return vocab, idf


def call(batch, vocab, idf, o):
    start = 2 if o["output_mode"] == "int" else 1
    index = {t: i + start for i, t in enumerate(vocab)}
    rows = [[0 if t == b"" else index.get(t, start - 1) for t in tokenize(s, o)] for s in batch]
    if o["output_mode"] == "int":
        length = o.get("output_sequence_length") or max((len(r) for r in rows), default=0)
        out = np.zeros((len(batch), length), np.int64)
        for i, r in enumerate(rows):
            r = r[:length]
            out[i, : len(r)] = r
        return out
    depth = o["max_tokens"] if o.get("pad_to_max_tokens") else start + len(vocab)
    out = np.zeros((len(batch), depth), np.float32)
    for i, s in enumerate(batch):
        for t in tokenize(s, o):
            if t != b"":
                out[i, index.get(t, 0)] += 1
    if o["output_mode"] == "multi_hot":
        out = (out > 0).astype(np.float32)
    if o["output_mode"] == "tf_idf":
        out = out * idf[None, :depth]
    return out


CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "the Dog barks; the FOX runs!",
    "  A dog, a fox\tand\na   cat...  ",
    "Ünïcode wörds stay as they are: ÄÖÜ (not lowered)",
    "[UNK] is only a token here, and so are brackets",
    "",
    "fox fox fox dog dog cat",
]
QUERIES = ["the fox and the cat", "unseen words only", "", "Dog! dog? DOG.", "fox jumps over the dog"]

CASES = [
    dict(output_mode="int"),
    dict(output_mode="int", output_sequence_length=6),
    dict(output_mode="int", max_tokens=8, output_sequence_length=4),
    dict(output_mode="int", standardize="lower"),
    dict(output_mode="int", standardize="strip_punctuation"),
    dict(output_mode="int", standardize=None),
    dict(output_mode="int", split="character", max_tokens=30),
    dict(output_mode="int", split=None),
    dict(output_mode="int", ngrams=[1, 2], max_tokens=40, output_sequence_length=12),
    dict(output_mode="int", ngrams=[2, 3]),
    dict(output_mode="multi_hot"),
    dict(output_mode="multi_hot", max_tokens=10, pad_to_max_tokens=True),
    dict(output_mode="count", max_tokens=12),
    dict(output_mode="tf_idf"),
    dict(output_mode="tf_idf", max_tokens=9, pad_to_max_tokens=True),
    dict(output_mode="count", ngrams=[1, 2]),
]


def main():
    cases = []
    for c in CASES:
        o = dict(standardize="lower_and_strip_punctuation", split="whitespace", ngrams=None)
        o.update(c)
        vocab, idf = adapt(CORPUS, o)
        out = call(QUERIES, vocab, idf, o)
        special = (["", "[UNK]"] if o["output_mode"] == "int" else ["[UNK]"])
        cases.append({
            "options": o,
            "vocabulary": special + [t.decode("utf-8") for t in vocab],
            "idf_weights": None if idf is None else [float(x) for x in idf],
            "output": out.tolist(),
        })
    # Ill-formed UTF-8 split into characters: Python's replacing decoder (maximal subparts).
    raw = [b"a\xffb", b"\xe2\x82", b"\xe2\x82\xac\xf0\x9f\x98", b"\xc0\xaf", b"\xed\xa0\x80x",
           b"\xf4\x90\x80\x80", b"ok\xf0\x9f\x98\x80"]
    characters = [{"bytes": list(r),
                   "characters": [list(ch.encode("utf-8")) for ch in r.decode("utf-8", "replace")]}
                  for r in raw]
    print(json.dumps({"corpus": CORPUS, "queries": QUERIES, "cases": cases,
                      "characters": characters}, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
