#!/usr/bin/python3
"""Writes the small images and the reference files that tests/data/test_images.cpp reads.

Run with Debian's python3-pil, python3-numpy and python3-torch:
    /usr/bin/python3 tests/data/images/generate_images.py
Everything is a function of this script (no randomness without a fixed seed), so a rerun rewrites
the same bytes. The references come from independent implementations:
- EXIF orientation: PIL's ImageOps.exif_transpose of exif<o>.jpg;
- decoding: PIL (which decodes JPEG with libjpeg too) -> <stem>_<ext>_c<channels>.npy (uint8);
  a CMYK JPEG's RGB from PIL's CMYK samples by TensorFlow's formula; BMP: the arrays written;
  GIF: PIL's indices and palette of the first frame;
- resize: torch.nn.functional.interpolate (bilinear with align_corners=False and antialias=False
  is tf.image.resize's half-pixel bilinear; 'nearest-exact' is tf's half-pixel nearest,
  floor((x + 0.5) * scale)); area: tf's ResizeArea reproduced in NumPy (float64), checked against
  torch's adaptive_avg_pool2d where the factors are integers;
- NumPy's RandomState(seed).shuffle orders (Keras shuffles file paths with it), and Keras's
  timeseries_dataset_from_array start positions computed with NumPy;
- the file order and validation split of keras.utils.image_dataset_from_directory, computed by
  Keras's index_directory logic (os.walk, sorted, RandomState shuffle, tail split) over folder/.
The seed corpora of tests/fuzz/fuzz_jpeg.cpp and fuzz_png.cpp are copies of the images.
"""
import json
import os
import shutil
import struct
import zlib

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(os.path.dirname(HERE))
REF = os.path.join(HERE, "reference")
CORPUS = {"jpeg": os.path.join(TESTS, "fuzz", "corpus", "jpeg"),
          "png": os.path.join(TESTS, "fuzz", "corpus", "png")}


def pattern(h, w, c, seed):
    """A smooth gradient with some texture: JPEG-friendly, every channel different."""
    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:h, 0:w]
    planes = []
    for k in range(c):
        v = 128 + 90 * np.sin((x * (k + 1) + y * (3 - k)) / 7.0) + rng.randint(-20, 21, (h, w))
        planes.append(np.clip(v, 0, 255))
    return np.stack(planes, axis=-1).astype(np.uint8)


def png_chunk(kind, data):
    return (struct.pack(">I", len(data)) + kind + data +
            struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def write_png16(path, array):
    """A 16-bit grey or RGB PNG written by hand (PIL writes no 16-bit RGB)."""
    h, w, c = array.shape
    color_type = {1: 0, 3: 2}[c]
    raw = b"".join(b"\x00" + array[y].astype(">u2").tobytes() for y in range(h))
    data = (b"\x89PNG\r\n\x1a\n" +
            png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0)) +
            png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(data)


def save_ref(name, array):
    np.save(os.path.join(REF, name), array)


def make_images():
    images = {}
    rgb = pattern(37, 53, 3, 1)
    gray = pattern(29, 41, 1, 2)[:, :, 0]
    Image.fromarray(rgb).save(os.path.join(HERE, "rgb.jpg"), quality=90)
    Image.fromarray(gray).save(os.path.join(HERE, "gray.jpg"), quality=90)
    Image.fromarray(pattern(96, 128, 3, 3)).save(os.path.join(HERE, "large.jpg"), quality=90)
    # A CMYK JPEG (PIL writes it inverted, with Adobe's marker, as Photoshop does).
    Image.fromarray(pattern(21, 27, 4, 9), "CMYK").save(os.path.join(HERE, "cmyk.jpg"), quality=90)
    Image.fromarray(rgb).save(os.path.join(HERE, "rgb.png"))
    Image.fromarray(pattern(23, 31, 4, 4), "RGBA").save(os.path.join(HERE, "rgba.png"))
    Image.fromarray(gray).save(os.path.join(HERE, "gray.png"))
    Image.fromarray(pattern(19, 17, 2, 5), "LA").save(os.path.join(HERE, "gray_alpha.png"))
    palette = Image.fromarray(pattern(21, 27, 3, 6)).quantize(16)
    palette.save(os.path.join(HERE, "palette.png"))
    palette.save(os.path.join(HERE, "palette_trns.png"), transparency=3)
    gray16 = pattern(13, 11, 1, 7).astype(np.uint16) * 257 + np.arange(11, dtype=np.uint16)[:, None]
    write_png16(os.path.join(HERE, "gray16.png"), gray16)
    rgb16 = pattern(9, 14, 3, 8).astype(np.uint16) * 251 + 7
    write_png16(os.path.join(HERE, "rgb16.png"), rgb16)
    images["gray16"] = gray16
    images["rgb16"] = rgb16
    # BMPs as PIL writes them (bottom-up, rows padded to 4 bytes: odd widths), and one top-down
    # (a negative height) made from the 24-bit one by hand.
    bmp = {"rgb24": pattern(11, 13, 3, 10), "rgba32": pattern(9, 7, 4, 11),
           "gray8": pattern(10, 15, 1, 12)}
    Image.fromarray(bmp["rgb24"]).save(os.path.join(HERE, "rgb24.bmp"))
    Image.fromarray(bmp["rgba32"], "RGBA").save(os.path.join(HERE, "rgba32.bmp"))
    Image.fromarray(bmp["gray8"][:, :, 0]).save(os.path.join(HERE, "gray8.bmp"))
    indices = (pattern(8, 9, 1, 13) // 16).astype(np.uint8)
    palette = Image.fromarray(indices[:, :, 0], "P")
    palette.putpalette([(37 * i) % 256 for i in range(48)])
    palette.save(os.path.join(HERE, "palette8.bmp"))
    bmp["palette8"] = indices
    with open(os.path.join(HERE, "rgb24.bmp"), "rb") as f:
        data = bytearray(f.read())
    offset = struct.unpack_from("<I", data, 10)[0]
    width, height = struct.unpack_from("<ii", data, 18)
    bits, compression = struct.unpack_from("<HI", data, 28)
    assert (width, height, bits, compression) == (13, 11, 24, 0)
    row = (3 * width + 3) // 4 * 4
    rows = [data[offset + y * row:offset + (y + 1) * row] for y in range(height)]
    struct.pack_into("<i", data, 22, -height)
    data[offset:] = b"".join(reversed(rows))
    with open(os.path.join(HERE, "topdown.bmp"), "wb") as f:
        f.write(data)
    bmp["topdown"] = bmp["rgb24"]
    for stem, channels in (("rgba32", 32), ("gray8", 8), ("palette8", 8)):
        with open(os.path.join(HERE, stem + ".bmp"), "rb") as f:
            header = f.read(34)
        assert struct.unpack_from("<HI", header, 28) == (channels, 0), stem
    images["bmp"] = bmp
    # GIFs as PIL writes them: a colour palette, interlaced (PIL's default from 16 rows) or not,
    # one with a transparent colour, and an animation whose later frames PIL crops to what
    # changes.
    colours = [(53 * i) % 256 for i in range(96)]
    indices = (pattern(19, 23, 1, 14)[:, :, 0] // 8).astype(np.uint8)
    single = Image.fromarray(indices, "P")
    single.putpalette(colours)
    single.save(os.path.join(HERE, "interlaced.gif"))
    single.save(os.path.join(HERE, "plain.gif"), interlace=False)
    single.save(os.path.join(HERE, "transparent.gif"), transparency=5)
    frames = [Image.fromarray(pattern(17, 21, 3, 15 + k)).quantize(24) for k in range(3)]
    for k in (1, 2):
        a = np.array(frames[0].convert("RGB"))
        a[4:9, 6:12] = pattern(5, 6, 3, 20 + k)
        frames[k] = Image.fromarray(a).quantize(24)
    frames[0].save(os.path.join(HERE, "animated.gif"), save_all=True, append_images=frames[1:],
                   duration=50, loop=0)
    return images


def pil_decode(path, channels):
    """The uint8 pixels tf.io.decode_image gives, computed with PIL."""
    img = Image.open(path)
    if img.mode in ("I;16", "I;16B", "I"):
        # 16-bit grey: tf keeps the high byte (libpng's strip_16); PIL's convert would clip.
        grey = (np.array(img).astype(np.int64) >> 8).astype(np.uint8)[:, :, None]
        return {0: grey, 1: grey, 3: np.repeat(grey, 3, axis=2),
                4: np.concatenate([np.repeat(grey, 3, axis=2), np.full_like(grey, 255)], axis=2)
                }[channels]
    if channels == 0:
        if img.mode == "P":
            img = img.convert("RGBA" if "transparency" in img.info else "RGB")
        a = np.array(img)
    else:
        a = np.array(img.convert({1: "L", 3: "RGB", 4: "RGBA"}[channels]))
    if a.ndim == 2:
        a = a[:, :, None]
    return a.astype(np.uint8)


def make_decode_references(images):
    cases = []
    for name in ["rgb.jpg", "gray.jpg", "large.jpg", "rgb.png", "rgba.png", "gray.png",
                 "gray_alpha.png", "palette.png", "palette_trns.png", "gray16.png"]:
        stem, ext = os.path.splitext(name)
        for channels in (0, 1, 3, 4):
            if ext == ".jpg" and channels == 4:
                continue
            ref = pil_decode(os.path.join(HERE, name), channels)
            ref_name = f"{stem}_{ext[1:]}_c{channels}.npy"
            save_ref(ref_name, ref)
            # libpng's and libjpeg's RGB -> grey differ from PIL's integer formula by rounding;
            # PIL keeps the alpha of grey + alpha images converted to RGB(A) where tf takes it
            # from the file too, so those are exact.
            colour_source = stem not in ("gray", "gray_alpha", "gray16")
            tolerance = 1 if channels == 1 and colour_source else 0
            if ext == ".jpg" and channels == 1 and colour_source:
                tolerance = 2  # libjpeg's luma (from YCbCr) against PIL's RGB -> L
            cases.append({"file": name, "channels": channels, "reference": ref_name,
                          "tolerance": tolerance})
    # CMYK: TensorFlow's decode_jpeg (core/lib/jpeg/jpeg_mem.cc) asks libjpeg for CMYK and makes
    # RGB itself, R = K * C / 255 in integers on the stored (inverted, Adobe) samples, which is
    # (255 - K) * (255 - C) / 255 on the true ones PIL decodes; for 0 or 3 channels alike.
    cmyk = np.array(Image.open(os.path.join(HERE, "cmyk.jpg"))).astype(np.int64)
    assert Image.open(os.path.join(HERE, "cmyk.jpg")).mode == "CMYK"
    rgb = ((255 - cmyk[:, :, 3:4]) * (255 - cmyk[:, :, :3]) // 255).astype(np.uint8)
    save_ref("cmyk_jpg_c3.npy", rgb)
    for channels in (0, 3):
        cases.append({"file": "cmyk.jpg", "channels": channels, "reference": "cmyk_jpg_c3.npy",
                      "tolerance": 0})
    # BMP: the arrays written into the files (uncompressed, lossless), as tf.io.decode_bmp gives
    # them: BGR(A) rows made RGB(A), an 8-bit file's stored samples (a palette's indices, greys
    # for a grey one), 3 channels repeating one sample, 4 adding an opaque alpha or keeping the
    # stored one (PIL would drop a 32-bit file's alpha, so it is not the reference here).
    for stem, array in images["bmp"].items():
        stored = array.shape[2]
        for channels in (0, 3, 4):
            if channels == 0:
                ref = array
            elif stored == 1:
                ref = np.repeat(array, 3, axis=2)
                if channels == 4:
                    ref = np.concatenate([ref, np.full_like(array, 255)], axis=2)
            elif channels == 3:
                ref = array[:, :, :3]
            else:
                ref = array if stored == 4 else np.concatenate(
                    [array, np.full_like(array[:, :, :1], 255)], axis=2)
            ref_name = f"{stem}_bmp_c{channels}.npy"
            save_ref(ref_name, ref.astype(np.uint8))
            cases.append({"file": stem + ".bmp", "channels": channels, "reference": ref_name,
                          "tolerance": 0})
    # GIF: the first frame as TensorFlow's gif_io.cc draws it (decode_image with
    # expand_animations=False): PIL's colour indices of that frame through its palette, the
    # transparent index black; the canvas is the largest frame's size, here the first's.
    for stem in ("interlaced", "plain", "transparent", "animated"):
        img = Image.open(os.path.join(HERE, stem + ".gif"))
        assert img.mode == "P" and img.tile[0][1] == (0, 0) + img.size, stem
        palette = np.array(img.getpalette(), dtype=np.uint8).reshape(-1, 3)
        idx = np.array(img)
        ref = palette[idx]
        if "transparency" in img.info:
            ref[idx == img.info["transparency"]] = 0
        ref_name = f"{stem}_gif_c3.npy"
        save_ref(ref_name, ref.astype(np.uint8))
        for channels in (0, 3):
            cases.append({"file": stem + ".gif", "channels": channels, "reference": ref_name,
                          "tolerance": 0})
    # Every frame of the animation as tf.io.decode_gif composes them: PIL's frames in RGB (each
    # drawn over the one before; PIL wrote them without a disposal method, so PIL's composition
    # is TensorFlow's).
    img = Image.open(os.path.join(HERE, "animated.gif"))
    frames = []
    for k in range(img.n_frames):
        img.seek(k)
        assert img.disposal_method in (0, 1), img.disposal_method
        frames.append(np.array(img.convert("RGB")))
    save_ref("animated_gif_frames.npy", np.stack(frames).astype(np.uint8))
    # 16-bit samples: the arrays written into the files.
    save_ref("gray16_16bit.npy", images["gray16"].astype(np.int32))
    save_ref("rgb16_16bit.npy", images["rgb16"].astype(np.int32))
    save_ref("rgb16_png_c0.npy", (images["rgb16"] >> 8).astype(np.uint8))
    cases.append({"file": "rgb16.png", "channels": 0, "reference": "rgb16_png_c0.npy",
                  "tolerance": 0})
    return cases


def area_resize(image, out_h, out_w):
    """tf's ResizeArea (align_corners=False) in float64."""
    in_h, in_w, c = image.shape

    def taps(in_size, out_size):
        scale = in_size / out_size
        result = []
        for i in range(out_size):
            in0, in1 = i * scale, (i + 1) * scale
            row = []
            for k in range(int(np.floor(in0)), int(np.ceil(in1))):
                if k < in0:
                    w = scale if k + 1 > in1 else k + 1 - in0
                else:
                    w = in1 - k if k + 1 > in1 else 1.0
                row.append((min(k, in_size - 1), w))
            result.append(row)
        return result, scale

    ys, sy = taps(in_h, out_h)
    xs, sx = taps(in_w, out_w)
    out = np.zeros((out_h, out_w, c))
    for y in range(out_h):
        for x in range(out_w):
            for iy, wy in ys[y]:
                for ix, wx in xs[x]:
                    out[y, x] += wy * wx * image[iy, ix]
    return (out / (sy * sx)).astype(np.float32)


def make_resize_references():
    image = np.array(Image.open(os.path.join(HERE, "rgb.png"))).astype(np.float32)
    nchw = torch.from_numpy(image).permute(2, 0, 1)[None]
    cases = []
    for h, w in [(20, 30), (80, 45), (13, 70), (37, 53)]:
        for method in ("bilinear", "nearest", "area"):
            if method == "bilinear":
                out = F.interpolate(nchw, size=(h, w), mode="bilinear", align_corners=False,
                                    antialias=False)[0].permute(1, 2, 0).numpy()
            elif method == "nearest":
                out = F.interpolate(nchw, size=(h, w), mode="nearest-exact")[0]
                out = out.permute(1, 2, 0).numpy()
            else:
                out = area_resize(image.astype(np.float64), h, w)
            name = f"resize_{method}_{h}x{w}.npy"
            save_ref(name, np.ascontiguousarray(out, dtype=np.float32))
            cases.append({"height": h, "width": w, "method": method, "reference": name})
    # The NumPy area resize agrees with torch's adaptive average pooling on integer factors.
    crop = image[:36, :52].astype(np.float64)
    pooled = F.adaptive_avg_pool2d(torch.from_numpy(crop).permute(2, 0, 1)[None], (12, 13))
    assert np.allclose(area_resize(crop, 12, 13), pooled[0].permute(1, 2, 0).numpy(), atol=1e-4)
    return cases


def make_exif_references():
    """exif<o>.jpg: a 9x14 JPEG with EXIF orientation o; the reference is PIL's exif_transpose."""
    cases = []
    pixels = pattern(9, 14, 3, 9)
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = orientation
        name = f"exif{orientation}.jpg"
        Image.fromarray(pixels).save(os.path.join(HERE, name), quality=95, exif=exif.tobytes())
        upright = ImageOps.exif_transpose(Image.open(os.path.join(HERE, name)))
        ref = f"exif{orientation}_upright.npy"
        save_ref(ref, np.array(upright).astype(np.uint8))
        cases.append({"file": name, "orientation": orientation, "reference": ref})
    return cases


def make_timeseries_references():
    """Keras's timeseries_dataset_from_array start positions: np.arange(0, num_seqs, stride),
    shuffled by RandomState(seed), with num_seqs = end - start - (length - 1) * rate, capped by
    the targets after start."""
    cases = []
    for steps, length, stride, rate, start, end, targets, seed in [
            (100, 5, 3, 2, 7, 90, 100, 4), (50, 10, 1, 1, 0, None, 30, 123),
            (64, 4, 5, 3, 0, None, None, 99)]:
        s = start or 0
        e = steps if end is None else end
        num_seqs = e - s - (length - 1) * rate
        if targets is not None:
            num_seqs = min(num_seqs, targets - s)
        positions = np.arange(0, num_seqs, stride, dtype="int32")
        np.random.RandomState(seed).shuffle(positions)
        cases.append({"steps": steps, "sequence_length": length, "sequence_stride": stride,
                      "sampling_rate": rate, "start_index": start, "end_index": end,
                      "targets": targets, "seed": seed, "positions": positions.tolist()})
    return cases


def make_shuffle_references():
    orders = []
    for seed in (0, 1, 42, 1337, 123456, 2**31 + 11, 2**32 - 1):
        for n in (1, 2, 3, 10, 100, 1000):
            items = list(range(n))
            np.random.RandomState(seed).shuffle(items)
            orders.append({"seed": seed, "n": n, "order": items})
    return orders


def make_folder():
    """folder/<class>/... with a nested folder, an upper-case extension, a skipped .txt and a
    hidden folder; images are tiny PNGs and JPEGs whose pixel value encodes the file."""
    root = os.path.join(HERE, "folder")
    shutil.rmtree(root, ignore_errors=True)
    files = {
        "cats": ["c0.png", "c1.jpg", "c2.PNG", "sub/c3.png", "sub/c4.jpeg"],
        "dogs": ["d0.png", "d1.png", "d2.jpg", "d3.png"],
        "birds": ["b0.png", "b1.png", "b2.png", "b3.jpg", "b4.png", "b5.png"],
    }
    value = 0
    for cls, names in files.items():
        for name in names:
            path = os.path.join(root, cls, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            value += 10
            img = Image.fromarray(np.full((6 + value // 40, 8, 3), value, dtype=np.uint8))
            img.save(path, format="JPEG" if name.lower().endswith((".jpg", ".jpeg")) else "PNG",
                     quality=95)
    with open(os.path.join(root, "cats", "notes.txt"), "w") as f:
        f.write("not an image\n")
    os.makedirs(os.path.join(root, ".hidden"), exist_ok=True)
    Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)).save(os.path.join(root, ".hidden",
                                                                            "h.png"))
    return root


def keras_index(directory, shuffle, seed, formats):
    """Keras's dataset_utils.index_directory with labels='inferred' and class_names=None."""
    subdirs = [d for d in sorted(os.listdir(directory))
               if os.path.isdir(os.path.join(directory, d)) and not d.startswith(".")]
    filenames, labels = [], []
    for index, subdir in enumerate(subdirs):
        path = os.path.join(directory, subdir)
        for root, _, names in sorted(os.walk(path), key=lambda x: x[0]):
            for fname in sorted(names):
                if fname.lower().endswith(formats):
                    filenames.append(os.path.join(subdir, os.path.relpath(
                        os.path.join(root, fname), path)))
                    labels.append(index)
    labels = np.array(labels, dtype="int32")
    if shuffle:
        np.random.RandomState(seed).shuffle(filenames)
        np.random.RandomState(seed).shuffle(labels)
    return filenames, labels.tolist(), subdirs


def make_folder_references(root):
    formats = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
    cases = []
    for shuffle, seed, split in [(False, 0, 0.0), (True, 7, 0.0), (True, 1337, 0.2),
                                 (True, 2024, 0.35)]:
        paths, labels, class_names = keras_index(root, shuffle, seed, formats)
        n_val = int(split * len(paths))
        case = {"shuffle": shuffle, "seed": seed, "validation_split": split,
                "class_names": class_names, "paths": paths, "labels": labels}
        if split:
            case["training"] = paths[:-n_val]
            case["validation"] = paths[-n_val:]
        cases.append(case)
    return cases


def main():
    os.makedirs(REF, exist_ok=True)
    images = make_images()
    manifest = {
        "decode": make_decode_references(images),
        "resize": make_resize_references(),
        "numpy_shuffle": make_shuffle_references(),
        "exif": make_exif_references(),
        "timeseries": make_timeseries_references(),
        "folder": make_folder_references(make_folder()),
    }
    with open(os.path.join(REF, "manifest.json.tmp"), "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(os.path.join(REF, "manifest.json.tmp"), os.path.join(REF, "manifest.json"))
    for kind, corpus in CORPUS.items():
        os.makedirs(corpus, exist_ok=True)
        for name in sorted(os.listdir(HERE)):
            # fuzz_jpeg decodes any bytes with decode_image: the BMPs and GIFs seed it too.
            if name.endswith((".jpg", ".bmp", ".gif") if kind == "jpeg" else (".png",)):
                shutil.copyfile(os.path.join(HERE, name), os.path.join(corpus, name))
    print("wrote", REF)


if __name__ == "__main__":
    main()
