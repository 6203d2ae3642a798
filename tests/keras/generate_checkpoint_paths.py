#!/usr/bin/python3
"""Reference file paths for tests/keras/test_model_checkpoint.cpp.

ModelCheckpoint fills its file path template with Python's str.format over `epoch` and `batch`
(ints) and the logs (floats), as Keras does (`filepath.format(epoch=epoch + 1, **logs)`). This
script formats every template below with CPython itself and records the result, or the kind of
error Python raised (KeyError for a missing name, ValueError for a bad spec or a spec that does
not fit the value's type, IndexError for a positional field).

Run:
    /usr/bin/python3 tests/keras/generate_checkpoint_paths.py
It writes tests/keras/reference/checkpoint_paths.json.
"""
import json
import math
import os

VALUES = {
    "epoch": 3,
    "batch": 12,
    "loss": 0.123456789,
    "val_loss": 1.0 / 3.0,
    "accuracy": 0.9375,
    "big": 1234567.891,
    "tiny": 0.0000123,
    "negative": -2.5,
    "zero": 0.0,
    "huge": 1e16,
    "round": 2.0,
    "inf": math.inf,
    "val_accuracy": 1.0,
}

TEMPLATES = [
    "ckpt-{epoch:02d}-{val_loss:.2f}.h5",
    "model.{epoch:03d}-{batch:04d}.keras",
    "{epoch}-{batch}-{loss}.h5",
    "{loss:.4f}_{accuracy:.1%}.h5",
    "{val_loss:e}-{val_loss:.3E}.h5",
    "{val_loss:g}-{big:g}-{tiny:g}-{huge:G}.h5",
    "{big:.3g}-{tiny:.2g}-{round:g}-{round:#g}.h5",
    "{big}-{tiny}-{huge}-{round}-{zero}-{negative}.h5",
    "{big:.3}-{round:.3}-{val_loss:.5}.h5",
    "{negative:08.3f}-{negative:+.1f}-{loss:+.2f}-{loss: .2f}.h5",
    "{epoch:>5d}|{epoch:<5d}|{epoch:^5d}|{epoch:*^7d}|{epoch:=+5d}.h5",
    "{big:,.2f}-{big:_.1f}-{epoch:,d}.h5",
    "{val_loss:10.4f}|{val_loss:<10.4f}|{val_loss:x>10.2f}.h5",
    "{epoch:.2f}-{epoch:e}-{epoch:%}.h5",
    "{inf:.2f}-{inf:F}-{inf}.h5",
    "{{literal}}-{epoch:02d}.h5",
    "{val_accuracy:.4f}-{val_accuracy}.h5",
    "plain.h5",
    # errors
    "{missing:.2f}.h5",
    "{val_loss:d}.h5",
    "{epoch:.2d}.h5",
    "{epoch:.f}.h5",
    "{}.h5",
    "{epoch.h5",
    "epoch}.h5",
    "{epoch:02q}.h5",
]


def main():
    cases = []
    for template in TEMPLATES:
        case = {"template": template}
        try:
            case["expected"] = template.format(**VALUES)
        except KeyError:
            case["error"] = "KeyError"
        except (ValueError, IndexError) as e:
            case["error"] = type(e).__name__
        cases.append(case)
    values = {k: (v if not (isinstance(v, float) and math.isinf(v)) else "inf")
              for k, v in VALUES.items()}
    out = {"values": values, "ints": ["epoch", "batch"], "cases": cases}
    path = os.path.join(os.path.dirname(__file__), "reference", "checkpoint_paths.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
