#!/usr/bin/python3
"""PyTorch on the workloads of bench_keras and bench_keras_gpu, for `benchmarks/run keras [--gpu]`.

The same models (the Fashion-MNIST MLP, the small CNN, the 1-D text CNN, the Transformer encoder
block, the small MobileNet and the small U-Net of benchmarks/keras/workloads.hpp, layer for layer:
sizes, strides, bias or not, activations, BatchNorm2d with Keras's epsilon 1e-3 and momentum 0.99
(PyTorch's 0.01); channels first as PyTorch wants), Adam(1e-3, eps 1e-7 as Keras) and
cross-entropy from logits (binary for the U-Net, against the mask of pixels whose first channel
exceeds 0.5), trained for the same 50 steps per pass (10 for the MobileNet and the U-Net) on
synthetic 28x28 images (32x32x3 for the MobileNet and the U-Net, 100 token ids for the text CNN
and the Transformer). Keras's "same" padding with stride 2 pads one row and column after the
image; PyTorch's padding=1 pads one on each side: the same output sizes and work.

--device cpu (the default): the "<workload>/<batch>/<threads>" grid with
torch.set_num_threads(threads), eager only.

--device cuda: the "<workload>/<batch>/gpu" grid (MLP, CNN, MobileNet and U-Net at batch 32 and
256) on the first GPU, with the 50 batches and their labels already in device memory and full fp32 (TF32 off for
matmuls and cuDNN convolutions, as the CUDA backend computes), each in two modes (--mode, default
both): "eager", the plain step with the default Adam (foreach), and "graph", the whole step
(forward, backward and Adam(capturable=True)) captured once in a CUDA graph
(torch.cuda.CUDAGraph: static input and target tensors, three warm-up steps on a side stream, then
per batch a copy into the static tensors and one replay). The device is synchronized before the
clock starts and before it is read at the end. Graph mode needs --device cuda; --device cuda needs
a PyTorch built with CUDA that sees a GPU; either is one line on stderr otherwise.

Each (workload, batch, threads or device, mode) runs in its own process, so that its peak resident
memory is its own. Prints a JSON list of {"workload", "batch", "threads", "value", "unit",
"peak_rss_mb"} on stdout; --device cuda records carry "threads": "gpu" and add "mode", "device"
(the GPU's name) and "torch" (PyTorch's version). Run with /usr/bin/python3 on the CPU, with the
GPU machine's python3 there. Takes --list, --only REGEX and --timeout S (see common.py); a
measuring process that dies, fails or outlives the timeout is reported in one line with the
workload and its exit code or error.

One script for both devices, so that the models, the data, the step and the bounded child
processes that `benchmarks/run` and dist_torch.py rely on exist once.
"""
import json
import multiprocessing
import queue as queues
import resource
import sys
import time

import common

STEPS = 50
# The MobileNet's and the U-Net's steps per pass (as workloads.hpp's image_steps).
IMAGE_STEPS = 10
MEASURE_SECONDS = 2.0
GRID = [("mlp", 32, 1), ("mlp", 32, 2), ("mlp", 256, 1), ("mlp", 256, 2), ("cnn", 32, 1),
        ("cnn", 32, 2), ("cnn", 256, 1), ("cnn", 256, 2), ("text", 32, 1), ("text", 32, 2),
        ("transformer", 32, 1), ("transformer", 32, 2), ("transformer", 256, 1),
        ("transformer", 256, 2)] + \
    [(w, b, t) for w in ("mobilenet", "unet") for b in (32, 256) for t in (1, 2)]
# --device cuda: (workload, batch), named "<workload>/<batch>/gpu".
GPU_GRID = [(w, b) for w in ("mlp", "cnn", "mobilenet", "unet") for b in (32, 256)]
MODES = ("eager", "graph")
TEXT_STEPS = 100
# The warm-up steps before a capture, on a side stream (as PyTorch's CUDA graph docs do).
GRAPH_WARMUP = 3


def mobilenet():
    """workloads.hpp's "mobilenet": a stride-2 stem, four depthwise-separable blocks, global
    average pooling and a dense layer; no bias before each BatchNorm2d."""
    import torch.nn as nn

    def conv_bn_relu6(cin, cout, size, stride, groups=1):
        return [nn.Conv2d(cin, cout, size, stride, padding=size // 2, groups=groups, bias=False),
                nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01), nn.ReLU6()]

    layers = conv_bn_relu6(3, 32, 3, 2)
    channels = 32
    for filters, stride in ((64, 1), (128, 2), (128, 1), (256, 2)):
        layers += conv_bn_relu6(channels, channels, 3, stride, groups=channels)  # depthwise
        layers += conv_bn_relu6(channels, filters, 1, 1)  # pointwise
        channels = filters
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10))


def unet():
    """workloads.hpp's "unet": two 3x3 relu convolutions per level (8, 16, 32 filters), max
    pooling down, 2x2 stride-2 transposed convolutions up, concatenated (upsampled first) with the
    encoder's output of the same size, and a 1x1 convolution to one logit per pixel."""
    import torch
    import torch.nn as nn

    def pair(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(),
                             nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU())

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.level1, self.level2, self.bottom = pair(3, 8), pair(8, 16), pair(16, 32)
            self.pool = nn.MaxPool2d(2)
            self.up2, self.decode2 = nn.ConvTranspose2d(32, 16, 2, 2), pair(32, 16)
            self.up1, self.decode1 = nn.ConvTranspose2d(16, 8, 2, 2), pair(16, 8)
            self.head = nn.Conv2d(8, 1, 1)

        def forward(self, x):
            level1 = self.level1(x)
            level2 = self.level2(self.pool(level1))
            x = self.bottom(self.pool(level2))
            x = self.decode2(torch.cat([self.up2(x), level2], 1))
            x = self.decode1(torch.cat([self.up1(x), level1], 1))
            return self.head(x)

    return UNet()


def model_of(workload):
    import torch.nn as nn

    if workload == "mobilenet":
        return mobilenet()
    if workload == "unet":
        return unet()

    class Transpose(nn.Module):
        def forward(self, x):
            return x.transpose(1, 2)

    if workload == "text":
        # Keras's Conv1D is channels_last; PyTorch's Conv1d wants (batch, channels, steps).
        return nn.Sequential(nn.Embedding(1000, 32), Transpose(), nn.Conv1d(32, 64, 5), nn.ReLU(),
                             nn.MaxPool1d(4), nn.Conv1d(64, 64, 5), nn.ReLU(),
                             nn.AdaptiveMaxPool1d(1), nn.Flatten(), nn.Linear(64, 10))
    if workload == "transformer":
        class Encoder(nn.Module):
            """Keras's Transformer block of bench_keras: MultiheadAttention(32, 2 heads) is
            Keras's MultiHeadAttention(2, key_dim=16) on 32 features."""

            def __init__(self):
                super().__init__()
                self.embedding = nn.Embedding(1000, 32)
                self.attention = nn.MultiheadAttention(32, 2, batch_first=True)
                self.norm1 = nn.LayerNorm(32, eps=1e-6)
                self.ffn = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
                self.norm2 = nn.LayerNorm(32, eps=1e-6)
                self.logits = nn.Linear(32, 10)

            def forward(self, tokens):
                x = self.embedding(tokens)
                out1 = self.norm1(x + self.attention(x, x, x, need_weights=False)[0])
                out2 = self.norm2(out1 + self.ffn(out1))
                return self.logits(out2.mean(dim=1))

        return Encoder()
    if workload == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1600, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def steps_of(workload):
    return IMAGE_STEPS if workload in ("mobilenet", "unet") else STEPS


def data_of(workload, batch, device):
    """steps_of(workload) batches of inputs and labels, made on (and kept in) device."""
    import torch
    steps = steps_of(workload)
    if workload in ("text", "transformer"):
        xs = [torch.randint(0, 1000, (batch, TEXT_STEPS), device=device) for _ in range(steps)]
    elif workload in ("mobilenet", "unet"):
        xs = [torch.rand((batch, 3, 32, 32), device=device) for _ in range(steps)]
    else:
        shape = (batch, 28, 28) if workload == "mlp" else (batch, 1, 28, 28)
        xs = [torch.rand(shape, device=device) for _ in range(steps)]
    if workload == "unet":  # the mask of the pixels whose first channel exceeds 0.5
        return xs, [(x[:, 0:1] > 0.5).float() for x in xs]
    ys = [torch.arange(batch, device=device) % 10 for _ in range(steps)]
    return xs, ys


def eager_pass(model, optimizer, loss_fn, xs, ys):
    """One pass of the plain training step over the batches."""
    def one_pass():
        for x, y in zip(xs, ys):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
    return one_pass


def graph_pass(model, optimizer, loss_fn, xs, ys):
    """One pass of replays of the whole step (forward, backward, Adam) captured in a CUDA graph,
    each after copying its batch into the static input and target tensors."""
    import torch
    static_x, static_y = xs[0].clone(), ys[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(GRAPH_WARMUP):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(static_x), static_y).backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_fn(model(static_x), static_y)
        static_loss.backward()
        optimizer.step()

    def one_pass():
        for x, y in zip(xs, ys):
            static_x.copy_(x)
            static_y.copy_(y)
            graph.replay()
    return one_pass


def full_fp32(torch):
    """No TF32 in matmuls and cuDNN convolutions: full fp32, as the CUDA backend computes.
    PyTorch 2.9 and later take fp32_precision (the allow_tf32 flags warn there)."""
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def measure(workload, batch, threads, queue, device="cpu", mode="eager"):
    """Sends the record of one measurement (or {"error": ...}) through queue."""
    try:
        queue.put(measure_record(workload, batch, threads, device, mode))
    except Exception as error:  # one line for the parent, never a traceback
        lines = str(error).strip().splitlines()
        queue.put({"error": f"{type(error).__name__}: {lines[0] if lines else ''}"})


def measure_record(workload, batch, threads, device, mode):
    import torch
    cuda = device == "cuda"
    if cuda:
        full_fp32(torch)
    else:
        torch.set_num_threads(threads)
    torch.manual_seed(1)
    model = model_of(workload).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7,
                                 **({"capturable": True} if mode == "graph" else {}))
    loss_fn = torch.nn.BCEWithLogitsLoss() if workload == "unet" else torch.nn.CrossEntropyLoss()
    xs, ys = data_of(workload, batch, device)
    one_pass = (graph_pass if mode == "graph" else eager_pass)(model, optimizer, loss_fn, xs, ys)
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)

    one_pass()  # warm-up
    synchronize()
    samples, start = 0, time.perf_counter()
    while time.perf_counter() - start < MEASURE_SECONDS:
        one_pass()
        samples += batch * len(xs)
    synchronize()  # every step queued is in the timed region
    rate = samples / (time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    record = {"workload": workload, "batch": batch, "threads": threads, "value": rate,
              "unit": "samples/s", "peak_rss_mb": peak}
    if cuda:
        record.update({"mode": mode, "device": torch.cuda.get_device_name(),
                       "torch": torch.__version__})
    return record


def name_of(workload, batch, threads):
    return f"{workload}/{batch}/{threads}"


def run_child(context, point, timeout, device="cpu", mode="eager"):
    """The record the measuring process sends, waiting at most timeout seconds for it."""
    workload, batch, threads = point
    name = name_of(*point) + ("" if device == "cpu" else f" ({mode})")
    queue = context.Queue()
    # The CPU grid calls measure as it always did (tests replace it with that signature).
    process = context.Process(target=measure, args=(workload, batch, threads, queue),
                              kwargs={} if device == "cpu" else {"device": device, "mode": mode})
    process.start()
    deadline = time.monotonic() + timeout
    record = None
    while record is None:
        try:
            record = queue.get(timeout=1.0)
            process.join(timeout=max(1.0, deadline - time.monotonic()))
            break
        except queues.Empty:
            pass
        if not process.is_alive():
            try:  # it may have sent its record just before exiting
                record = queue.get(timeout=1.0)
                break
            except queues.Empty:
                common.fail(name, f"the measuring process exited with code {process.exitcode} "
                            "before sending its result")
        if time.monotonic() > deadline:
            process.kill()
            process.join(timeout=10)
            common.fail(name, f"the measuring process sent no result within {timeout:g} s; "
                        "killed")
    if "error" in record:
        common.fail(name, f"the measurement failed ({record['error']})")
    return record


def add_arguments(parser):
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cpu: the <workload>/<batch>/<threads> grid (default); cuda: the "
                        "<workload>/<batch>/gpu grid on the first GPU")
    parser.add_argument("--mode", choices=["eager", "graph", "both"],
                        help="eager: the plain step; graph: the whole step replayed from a CUDA "
                        "graph (needs --device cuda); both (the default with --device cuda)")


def points_of(args):
    """[(workload, batch, threads or "gpu")] of the device's grid."""
    if args.device == "cuda":
        return [(workload, batch, "gpu") for workload, batch in GPU_GRID]
    return GRID


def check_device(device, modes):
    """Ends the script in one line where the device or a mode cannot run here."""
    if "graph" in modes and device != "cuda":
        common.fail("--mode graph", "the graph mode captures the training step in a CUDA graph "
                    "and needs --device cuda")
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            why = ("it was built without CUDA" if torch.version.cuda is None
                   else "it sees no CUDA device (torch.cuda.is_available() is False)")
            common.fail("--device cuda", f"PyTorch {torch.__version__} at {sys.executable} "
                        f"cannot use a GPU: {why}")


def main():
    selected, args = common.select(lambda args: [name_of(*p) for p in points_of(args)],
                                   __doc__.splitlines()[0], add_arguments)
    mode = args.mode or ("both" if args.device == "cuda" else "eager")
    modes = MODES if mode == "both" else (mode,)
    points = [p for p in points_of(args) if name_of(*p) in selected]
    if points:
        check_device(args.device, modes)
    records = []
    context = multiprocessing.get_context("spawn")
    for point in points:
        for mode in modes:
            records.append(run_child(context, point, args.timeout, args.device, mode))
    json.dump(records, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
