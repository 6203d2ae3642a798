// cuDNN's convolution algorithms for the benchmark CNN's two convolutions (bench_keras_gpu's
// cnn: 28x28x1 -> 3x3x32 and 13x13x32 -> 3x3x64, both valid), at batch 32 and 256: for each
// direction (forward, data gradient, filter gradient) and layout (NHWC, the layout Keras's
// channels_last tensors have and CudaOptions::convolution = Convolution::cudnn uses, and NCHW,
// for comparison), the algorithm the backend takes (the first of cuDNN's heuristic ranking
// that is deterministic and uses no tensor cores) and every algorithm cuDNN measures itself
// (cudnnFindConvolution*Algorithm), with its time, workspace and determinism, in full fp32
// (CUDNN_FMA_MATH). Says which convolution a CudaBackend should take and why; run on a GPU.
//
// Usage: cudnn_algorithms [BATCH...]   (default 32 256)
#include <cudnn.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

void check(cudnnStatus_t status, const char* call) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  std::fprintf(stderr, "cudnn_algorithms: %s failed: %s\n", call, cudnnGetErrorString(status));
  std::exit(1);
}

struct Geometry {
  const char* name;
  int batch, height, width, in_c, out_c, kernel;
};

struct Row {
  int algo;
  cudnnStatus_t status;
  float ms;
  std::size_t memory;
  cudnnDeterminism_t determinism;
  cudnnMathType_t math;
};

template <class Perf>
Row row_of(const Perf& p) {
  return {static_cast<int>(p.algo), p.status, p.time, p.memory, p.determinism, p.mathType};
}

/// The backend's pick: the first of the heuristic's ranking that succeeds, is deterministic and
/// uses no tensor cores (as CudnnConvolution::first_deterministic), or -1.
int backend_pick(const std::vector<Row>& ranked) {
  for (const Row& r : ranked)
    if (r.status == CUDNN_STATUS_SUCCESS && r.determinism == CUDNN_DETERMINISTIC &&
        r.math != CUDNN_TENSOR_OP_MATH && r.math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)
      return r.algo;
  return -1;
}

void print(const char* direction, const std::vector<Row>& ranked, const std::vector<Row>& found) {
  const int pick = backend_pick(ranked);
  float pick_ms = -1.0F, best_ms = -1.0F;
  int best = -1;
  for (const Row& r : found) {
    if (r.status != CUDNN_STATUS_SUCCESS) continue;
    if (r.algo == pick) pick_ms = r.ms;
    if (r.determinism == CUDNN_DETERMINISTIC && (best < 0 || r.ms < best_ms)) {
      best = r.algo;
      best_ms = r.ms;
    }
  }
  std::printf(
      "    %-13s backend's pick: algo %d (%.1f us); fastest deterministic: algo %d (%.1f us)\n",
      direction, pick, pick_ms * 1e3F, best, best_ms * 1e3F);
  std::printf("      measured:");
  for (const Row& r : found) {
    if (r.status != CUDNN_STATUS_SUCCESS) continue;
    std::printf(" %d=%.1fus%s%s", r.algo, r.ms * 1e3F,
                r.determinism == CUDNN_DETERMINISTIC ? "" : "(nondet)",
                r.memory > 0 ? ("[" + std::to_string(r.memory >> 10U) + "KiB]").c_str() : "");
  }
  std::printf("\n");
}

/// One direction: the heuristic's ranking (`rank(n, &returned, perf)`) and cuDNN's measurements
/// (`find(...)`) of its algorithms, printed.
template <class Perf, class Rank, class Find>
void compare(const char* direction, Rank rank, Find find) {
  constexpr int n = 16;
  const auto rows = [](auto query) {
    Perf perf[n];
    int returned = 0;
    query(n, &returned, perf);
    std::vector<Row> out;
    for (int i = 0; i < returned; ++i)
      out.push_back(row_of(perf[i]));
    return out;
  };
  print(direction, rows(rank), rows(find));
}

void probe(cudnnHandle_t handle, const Geometry& g, cudnnTensorFormat_t format) {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  check(cudnnCreateTensorDescriptor(&x), "cudnnCreateTensorDescriptor");
  check(cudnnCreateTensorDescriptor(&y), "cudnnCreateTensorDescriptor");
  check(cudnnCreateFilterDescriptor(&w), "cudnnCreateFilterDescriptor");
  check(cudnnCreateConvolutionDescriptor(&conv), "cudnnCreateConvolutionDescriptor");
  const int out_h = g.height - g.kernel + 1, out_w = g.width - g.kernel + 1;
  check(cudnnSetTensor4dDescriptor(x, format, CUDNN_DATA_FLOAT, g.batch, g.in_c, g.height, g.width),
        "cudnnSetTensor4dDescriptor");
  check(cudnnSetTensor4dDescriptor(y, format, CUDNN_DATA_FLOAT, g.batch, g.out_c, out_h, out_w),
        "cudnnSetTensor4dDescriptor");
  check(
      cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, format, g.out_c, g.in_c, g.kernel, g.kernel),
      "cudnnSetFilter4dDescriptor");
  check(cudnnSetConvolution2dDescriptor(conv, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                        CUDNN_DATA_FLOAT),
        "cudnnSetConvolution2dDescriptor");
  check(cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH), "cudnnSetConvolutionMathType");
  std::printf("  %s batch %d, %s\n", g.name, g.batch,
              format == CUDNN_TENSOR_NHWC ? "NHWC" : "NCHW");
  compare<cudnnConvolutionFwdAlgoPerf_t>(
      "forward",
      [&](int n, int* got, auto* perf) {
        check(cudnnGetConvolutionForwardAlgorithm_v7(handle, x, w, conv, y, n, got, perf),
              "cudnnGetConvolutionForwardAlgorithm_v7");
      },
      [&](int n, int* got, auto* perf) {
        check(cudnnFindConvolutionForwardAlgorithm(handle, x, w, conv, y, n, got, perf),
              "cudnnFindConvolutionForwardAlgorithm");
      });
  compare<cudnnConvolutionBwdDataAlgoPerf_t>(
      "data grad",
      [&](int n, int* got, auto* perf) {
        check(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, w, y, conv, x, n, got, perf),
              "cudnnGetConvolutionBackwardDataAlgorithm_v7");
      },
      [&](int n, int* got, auto* perf) {
        check(cudnnFindConvolutionBackwardDataAlgorithm(handle, w, y, conv, x, n, got, perf),
              "cudnnFindConvolutionBackwardDataAlgorithm");
      });
  compare<cudnnConvolutionBwdFilterAlgoPerf_t>(
      "filter grad",
      [&](int n, int* got, auto* perf) {
        check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, x, y, conv, w, n, got, perf),
              "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
      },
      [&](int n, int* got, auto* perf) {
        check(cudnnFindConvolutionBackwardFilterAlgorithm(handle, x, y, conv, w, n, got, perf),
              "cudnnFindConvolutionBackwardFilterAlgorithm");
      });
  cudnnDestroyConvolutionDescriptor(conv);
  cudnnDestroyFilterDescriptor(w);
  cudnnDestroyTensorDescriptor(y);
  cudnnDestroyTensorDescriptor(x);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> batches;
  for (int i = 1; i < argc; ++i) {
    const int batch = std::atoi(argv[i]);
    if (batch <= 0) {
      std::fprintf(stderr, "cudnn_algorithms: '%s' is not a batch size (a positive number)\n",
                   argv[i]);
      return 2;
    }
    batches.push_back(batch);
  }
  if (batches.empty()) batches = {32, 256};
  cudnnHandle_t handle = nullptr;
  check(cudnnCreate(&handle), "cudnnCreate");
  std::printf("cuDNN %zu; times in microseconds, measured by cuDNN (cudnnFind*), FMA math\n",
              cudnnGetVersion());
  for (const int batch : batches)
    for (const Geometry& g : {Geometry{"conv1 28x28x1->26x26x32", batch, 28, 28, 1, 32, 3},
                              Geometry{"conv2 13x13x32->11x11x64", batch, 13, 13, 32, 64, 3}})
      for (const cudnnTensorFormat_t format : {CUDNN_TENSOR_NHWC, CUDNN_TENSOR_NCHW})
        probe(handle, g, format);
  cudnnDestroy(handle);
  return 0;
}
