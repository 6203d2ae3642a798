#!/usr/bin/python3
"""PyTorch on the workloads of bench_keras and bench_keras_gpu, for `benchmarks/run keras [--gpu]`.

The same models (the Fashion-MNIST MLP, the small CNN, the 1-D text CNN, the Transformer encoder
block, the small MobileNet, the small U-Net, the ResNet and the grouped CNN (CPU only) of
benchmarks/keras/workloads.hpp, layer
for layer: sizes, strides, bias or not, activations, BatchNorm2d with Keras's epsilon 1e-3 and
momentum 0.99 (PyTorch's 0.01); channels first as PyTorch wants), Adam(1e-3, eps 1e-7 as Keras)
and cross-entropy from logits (binary for the U-Net, against the mask of pixels whose first
channel exceeds 0.5), trained for the same 50 steps per pass (10 for the MobileNet, the U-Net and
the grouped CNN, 2 for the ResNet) on synthetic 28x28 images (32x32x3 for the MobileNet, the
U-Net, the ResNet and the grouped CNN,
100 token ids for the text CNN and the Transformer). Keras's "same" padding with stride 2 pads one
row and column after the image; PyTorch's padding=1 pads one on each side: the same output sizes
and work.

The ResNet's rows carry the Keras dtype policy as a fourth part of their names
("resnet/<batch>/<threads>/<policy>"): "float32" trains in float32; "mixed_bfloat16" and
"mixed_float16" run the forward pass and the loss under torch.autocast of the policy's compute
dtype (the parameters, the gradients and Adam stay float32, as Keras's mixed policies keep the
variables), "mixed_float16" with a torch.cuda.amp.GradScaler (Keras's LossScaleOptimizer; in the
graph mode with Adam(fused=True), which takes the scaler's scale and overflow flag on the device,
so that the step is captured whole); on the GPU the mixed rows also keep the model and the images
in channels_last, PyTorch's fastest layout for half-precision convolutions.

--device cpu (the default): the "<workload>/<batch>/<threads>" grid with
torch.set_num_threads(threads), eager only.

--device cuda: the "<workload>/<batch>/gpu" grid (MLP, CNN, MobileNet, U-Net, Transformer block
and bidirectional LSTM (cuDNN's, as nn.LSTM runs on a GPU) at batch 32 and 256, the ResNet at 128 and 512 in each policy) on the first GPU, with the 50 batches and their labels already in device memory and full fp32 (TF32 off for
matmuls and cuDNN convolutions, as the CUDA backend computes), each in two modes (--mode, default
both): "eager", the plain step with the default Adam (foreach), and "graph", the whole step
(forward, backward and Adam(capturable=True)) captured once in a CUDA graph
(torch.cuda.CUDAGraph: static input and target tensors, three warm-up steps on a side stream, then
per batch a copy into the static tensors and one replay). The device is synchronized before the
clock starts and before it is read at the end. Graph mode needs --device cuda; --device cuda needs
a PyTorch built with CUDA that sees a GPU; either is one line on stderr otherwise.

Each (workload, batch, threads or device, policy, mode) runs in its own process, so that its peak
resident memory is its own. Prints a JSON list of {"workload", "batch", "threads", "value",
"unit", "peak_rss_mb"} on stdout (the ResNet's records add "policy"); --device cuda records carry "threads": "gpu" and add "mode", "device"
(the GPU's name) and "torch" (PyTorch's version). Run with /usr/bin/python3 on the CPU, with the
GPU machine's python3 there. Takes --list, --only REGEX and --timeout S (see common.py); a
measuring process that dies, fails or outlives the timeout is reported in one line with the
workload and its exit code or error.

One script for both devices, so that the models, the data, the step and the bounded child
processes that `benchmarks/run` and dist_torch.py rely on exist once.
"""
import contextlib
import functools
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
# The ResNet's steps per pass and residual blocks per stage (workloads.hpp's resnet_steps and
# resnet_blocks).
RESNET_STEPS = 2
RESNET_BLOCKS = 1
MEASURE_SECONDS = 2.0
GRID = [("mlp", 32, 1), ("mlp", 32, 2), ("mlp", 256, 1), ("mlp", 256, 2), ("cnn", 32, 1),
        ("cnn", 32, 2), ("cnn", 256, 1), ("cnn", 256, 2), ("text", 32, 1), ("text", 32, 2),
        ("transformer", 32, 1), ("transformer", 32, 2), ("transformer", 256, 1),
        ("transformer", 256, 2), ("bilstm", 32, 1), ("bilstm", 32, 2), ("bilstm", 256, 1),
        ("bilstm", 256, 2)] + \
    [(w, b, t) for w in ("mobilenet", "unet", "grouped") for b in (32, 256) for t in (1, 2)] + \
    [("resnet", b, t, p) for b in (128, 512) for t in (1, 2) for p in ("float32", "mixed_bfloat16")]
# --device cuda: (workload, batch) or (workload, batch, policy), named "<workload>/<batch>/gpu" or
# "resnet/<batch>/gpu/<policy>".
GPU_GRID = [(w, b) for w in ("mlp", "cnn", "mobilenet", "unet", "transformer", "bilstm")
            for b in (32, 256)] + \
    [("resnet", b, p) for b in (128, 512) for p in ("float32", "mixed_float16", "mixed_bfloat16")]
# The compute dtype of each mixed policy (torch.autocast's dtype).
AUTOCAST = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}
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


def grouped():
    """workloads.hpp's "grouped": three 3x3 "same" relu convolutions (32 filters, then 64 in 4
    groups, then 64 in 8 groups), global average pooling and a dense layer."""
    import torch.nn as nn
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 64, 3, padding=1, groups=4), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, padding=1, groups=8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


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


def resnet():
    """workloads.hpp's "resnet": a stem 3x3 convolution, three stages of RESNET_BLOCKS residual
    blocks (16, 32, 64 filters; stride 2 and a 1x1 stride-2 projection with BatchNorm2d in the
    first block of the second and third stages), global average pooling and a dense layer; no bias
    before each BatchNorm2d."""
    import torch.nn as nn

    def conv_bn(cin, cout, size, stride):
        return [nn.Conv2d(cin, cout, size, stride, padding=size // 2, bias=False),
                nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01)]

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(*conv_bn(cin, cout, 3, stride), nn.ReLU(),
                                      *conv_bn(cout, cout, 3, 1))
            self.shortcut = nn.Sequential(*conv_bn(cin, cout, 1, stride)) if stride != 1 \
                else nn.Identity()
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(self.shortcut(x) + self.body(x))

    layers = conv_bn(3, 16, 3, 1) + [nn.ReLU()]
    channels = 16
    for filters in (16, 32, 64):
        for block in range(RESNET_BLOCKS):
            stride = 2 if block == 0 and filters != channels else 1
            layers.append(Block(channels, filters, stride))
            channels = filters
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10))


def model_of(workload):
    import torch
    import torch.nn as nn

    if workload == "mobilenet":
        return mobilenet()
    if workload == "unet":
        return unet()
    if workload == "resnet":
        return resnet()
    if workload == "grouped":
        return grouped()

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
    if workload == "bilstm":
        class BiLSTM(nn.Module):
            """Keras's Bidirectional(LSTM(64)) of bench_keras: the forward direction's last output
            and the backward direction's (after reading the sequence from its end), concatenated,
            are nn.LSTM(bidirectional=True)'s final hidden states."""

            def __init__(self):
                super().__init__()
                self.embedding = nn.Embedding(1000, 32)
                self.lstm = nn.LSTM(32, 64, batch_first=True, bidirectional=True)
                self.logits = nn.Linear(128, 10)

            def forward(self, tokens):
                _, (h, _) = self.lstm(self.embedding(tokens))
                return self.logits(torch.cat([h[0], h[1]], dim=1))

        return BiLSTM()
    if workload == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1600, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def steps_of(workload):
    if workload == "resnet":
        return RESNET_STEPS
    return IMAGE_STEPS if workload in ("mobilenet", "unet", "grouped") else STEPS


def data_of(workload, batch, device):
    """steps_of(workload) batches of inputs and labels, made on (and kept in) device."""
    import torch
    steps = steps_of(workload)
    if workload in ("text", "transformer", "bilstm"):
        xs = [torch.randint(0, 1000, (batch, TEXT_STEPS), device=device) for _ in range(steps)]
    elif workload in ("mobilenet", "unet", "resnet", "grouped"):
        xs = [torch.rand((batch, 3, 32, 32), device=device) for _ in range(steps)]
    else:
        shape = (batch, 28, 28) if workload == "mlp" else (batch, 1, 28, 28)
        xs = [torch.rand(shape, device=device) for _ in range(steps)]
    if workload == "unet":  # the mask of the pixels whose first channel exceeds 0.5
        return xs, [(x[:, 0:1] > 0.5).float() for x in xs]
    ys = [torch.arange(batch, device=device) % 10 for _ in range(steps)]
    return xs, ys


class Step:
    """One training step: the forward pass and the loss under `autocast()` (a no-op context for
    float32), the backward pass and Adam, through `scaler` (a GradScaler) when there is one."""

    def __init__(self, model, optimizer, loss_fn, autocast=contextlib.nullcontext, scaler=None):
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.autocast, self.scaler = autocast, scaler

    def __call__(self, x, y, set_to_none=False):
        self.optimizer.zero_grad(set_to_none=set_to_none)
        with self.autocast():
            loss = self.loss_fn(self.model(x), y)
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()


def eager_pass(step, xs, ys):
    """One pass of the plain training step over the batches."""
    def one_pass():
        for x, y in zip(xs, ys):
            step(x, y)
    return one_pass


def graph_pass(step, xs, ys):
    """One pass of replays of the whole step (forward, backward, Adam) captured in a CUDA graph,
    each after copying its batch into the static input and target tensors."""
    import torch
    static_x, static_y = xs[0].clone(), ys[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(GRAPH_WARMUP):
            step(static_x, static_y, set_to_none=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(static_x, static_y, set_to_none=True)

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


def measure(workload, batch, threads, queue, device="cpu", mode="eager", policy=None):
    """Sends the record of one measurement (or {"error": ...}) through queue."""
    try:
        queue.put(measure_record(workload, batch, threads, device, mode, policy))
    except Exception as error:  # one line for the parent, never a traceback
        lines = str(error).strip().splitlines()
        queue.put({"error": f"{type(error).__name__}: {lines[0] if lines else ''}"})


def step_of(model, workload, device, mode, policy):
    """The training step of the model in the policy (see the file's comment)."""
    import torch
    half = AUTOCAST.get(policy)
    scaler = torch.cuda.amp.GradScaler() if policy == "mixed_float16" else None
    options = {"capturable": True} if mode == "graph" else {}
    if mode == "graph" and scaler is not None:
        # The fused Adam takes the scaler's scale and overflow flag on the device, so that
        # scaler.step does not wait for the host and the step can be captured.
        options = {"fused": True}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7, **options)
    loss_fn = torch.nn.BCEWithLogitsLoss() if workload == "unet" else torch.nn.CrossEntropyLoss()
    autocast = contextlib.nullcontext
    if half:
        # A captured step records its casts: no cache of cast weights (PyTorch's advice for
        # autocast in CUDA graphs).
        autocast = functools.partial(torch.autocast, device, dtype=getattr(torch, half),
                                     cache_enabled=mode != "graph")
    return Step(model, optimizer, loss_fn, autocast, scaler)


def measure_record(workload, batch, threads, device, mode, policy=None):
    import torch
    cuda = device == "cuda"
    if cuda:
        full_fp32(torch)
    else:
        torch.set_num_threads(threads)
    torch.manual_seed(1)
    model = model_of(workload).to(device)
    xs, ys = data_of(workload, batch, device)
    if cuda and policy in AUTOCAST:
        model = model.to(memory_format=torch.channels_last)
        xs = [x.contiguous(memory_format=torch.channels_last) for x in xs]
    step = step_of(model, workload, device, mode, policy)
    one_pass = (graph_pass if mode == "graph" else eager_pass)(step, xs, ys)
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
    if policy is not None:
        record["policy"] = policy
    if cuda:
        record.update({"mode": mode, "device": torch.cuda.get_device_name(),
                       "torch": torch.__version__})
    return record


def name_of(*point):
    """"<workload>/<batch>/<threads or gpu>", and "/<policy>" for the ResNet's rows."""
    return "/".join(str(part) for part in point)


def run_child(context, point, timeout, device="cpu", mode="eager"):
    """The record the measuring process sends, waiting at most timeout seconds for it."""
    workload, batch, threads = point[:3]
    name = name_of(*point) + ("" if device == "cpu" else f" ({mode})")
    queue = context.Queue()
    # The CPU grid's float32 rows call measure as they always did (tests replace it with that
    # signature).
    kwargs = {} if device == "cpu" else {"device": device, "mode": mode}
    if len(point) > 3:
        kwargs["policy"] = point[3]
    process = context.Process(target=measure, args=(workload, batch, threads, queue),
                              kwargs=kwargs)
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
    """[(workload, batch, threads or "gpu"[, policy])] of the device's grid."""
    if args.device == "cuda":
        return [(point[0], point[1], "gpu", *point[2:]) for point in GPU_GRID]
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
