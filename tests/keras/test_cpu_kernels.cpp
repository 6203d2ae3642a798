// The CPU backend's fused and vectorized kernels against the plain composition of its other
// kernels (each of which the layer tests check against PyTorch), and the rules the vector code
// must keep: the first maximum of a pooling window takes the gradient, a NaN first pixel keeps
// it, and the bias gradient of a convolution has the same bits for any thread count.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <string>
#include <vector>

#include "random_tensor.hpp"

using namespace loadstar;
using namespace loadstar::keras;

namespace {

using test_support::random_tensor;

void check_close(const Tensor<float>& got, const Tensor<float>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  float worst = 0.0F;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const float error =
        std::abs(got.data()[i] - want.data()[i]) / std::max(1.0F, std::abs(want.data()[i]));
    if (!(error <= worst)) {
      worst = error;
      at = i;
    }
  }
  INFO(what << ": largest relative error " << worst << " at element " << at);
  CHECK(worst <= 2e-5F);
}

struct ConvCase {
  std::string name;
  Conv2DGeometry g;
  keras::Activation activation;
  bool bias;
};

Conv2DGeometry geometry(std::size_t batch, std::size_t h, std::size_t w, std::size_t c,
                        std::size_t k, std::size_t filters, std::size_t stride,
                        std::size_t dilation, bool same) {
  Conv2DGeometry g;
  g.batch = batch;
  g.in_h = h;
  g.in_w = w;
  g.in_c = c;
  g.out_c = filters;
  g.kernel_h = g.kernel_w = k;
  g.stride_h = g.stride_w = stride;
  g.dilation_h = g.dilation_w = dilation;
  const AxisGeometry rows = axis_geometry(h, k, stride, dilation, same);
  const AxisGeometry cols = axis_geometry(w, k, stride, dilation, same);
  g.out_h = rows.out;
  g.out_w = cols.out;
  g.pad_top = rows.pad_before;
  g.pad_left = cols.pad_before;
  return g;
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("CpuBackend's tiled convolution matches im2col + gemm on the whole batch") {
    const std::vector<ConvCase> cases = {
        {"valid 3x3, relu, many images per tile", geometry(13, 20, 20, 1, 3, 8, 1, 1, false),
         keras::Activation::relu, true},
        {"same 3x3 stride 2, swish (gradient from the input)",
         geometry(5, 11, 10, 6, 3, 16, 2, 1, true), keras::Activation::swish, true},
        {"same 3x3 dilation 2, linear, no bias", geometry(3, 12, 12, 4, 3, 5, 1, 2, true),
         keras::Activation::linear, false},
        {"valid 5x5, tanh, one image per tile", geometry(4, 40, 40, 8, 5, 12, 1, 1, false),
         keras::Activation::tanh, true},
        {"valid 3x3, softmax", geometry(2, 6, 7, 3, 3, 4, 1, 1, false), keras::Activation::softmax,
         true},
    };
    for (const ConvCase& c : cases) {
      for (const std::size_t threads : {1, 3}) {
        CAPTURE(c.name);
        CAPTURE(threads);
        const Conv2DGeometry& g = c.g;
        CpuBackend backend(threads);
        const Tensor<float> x = random_tensor({g.batch, g.in_h, g.in_w, g.in_c}, 1);
        const Tensor<float> kernel = random_tensor({g.patch_size(), g.out_c}, 2);
        const Tensor<float> bias = c.bias ? random_tensor({g.out_c}, 3) : Tensor<float>();
        const std::size_t rows = g.batch * g.out_h * g.out_w;
        Tensor<float> y({rows, g.out_c}), y_plain({rows, g.out_c});
        backend.conv2d_forward(x, g, kernel, bias, c.activation, y);
        backend.Backend::conv2d_forward(x, g, kernel, bias, c.activation, y_plain);
        check_close(y, y_plain, "forward");

        const Tensor<float> dy = random_tensor({rows, g.out_c}, 4);
        for (const bool accumulate : {true, false}) {
          CAPTURE(accumulate);
          // Gradients accumulate onto what is there, or are written over NaNs.
          const auto start = [&](const Shape& shape, std::uint64_t seed) {
            return test_support::gradient_start(shape, seed, accumulate);
          };
          const Tensor<float> dkernel = start(kernel.shape(), 5);
          const Tensor<float> dkernel_plain = dkernel.clone();
          const Tensor<float> dbias = c.bias ? start({g.out_c}, 6) : Tensor<float>();
          const Tensor<float> dbias_plain = dbias.clone();
          Tensor<float> dx(x.shape()), dx_plain(x.shape());
          backend.conv2d_backward(x, g, kernel, bias, c.activation, y, dy, dkernel, dbias, dx,
                                  accumulate);
          backend.Backend::conv2d_backward(x, g, kernel, bias, c.activation, y_plain, dy,
                                           dkernel_plain, dbias_plain, dx_plain, accumulate);
          check_close(dkernel, dkernel_plain, "kernel gradient");
          if (c.bias) check_close(dbias, dbias_plain, "bias gradient");
          check_close(dx, dx_plain, "input gradient");

          // Without an input gradient (a first layer), the weight gradients are the same.
          const Tensor<float> dkernel_alone = start(kernel.shape(), 5);
          const Tensor<float> dbias_alone = c.bias ? start({g.out_c}, 6) : Tensor<float>();
          backend.conv2d_backward(x, g, kernel, bias, c.activation, y, dy, dkernel_alone,
                                  dbias_alone, Tensor<float>(), accumulate);
          CHECK(dkernel_alone == dkernel);
          if (c.bias) CHECK(dbias_alone == dbias);

          // Written gradients have the bits of gradients added to zeros.
          if (!accumulate) {
            Tensor<float> dkernel_zeros(kernel.shape());
            Tensor<float> dbias_zeros = c.bias ? Tensor<float>({g.out_c}) : Tensor<float>();
            backend.conv2d_backward(x, g, kernel, bias, c.activation, y, dy, dkernel_zeros,
                                    dbias_zeros, Tensor<float>(), true);
            CHECK(dkernel_zeros == dkernel);
            if (c.bias) CHECK(dbias_zeros == dbias);
          }
        }
      }
    }
  }

  TEST_CASE("A convolution's bias gradient has the same bits for any thread count") {
    const Conv2DGeometry g = geometry(37, 14, 14, 3, 3, 24, 1, 1, true);
    const Tensor<float> x = random_tensor({g.batch, g.in_h, g.in_w, g.in_c}, 7);
    const Tensor<float> kernel = random_tensor({g.patch_size(), g.out_c}, 8);
    const std::size_t rows = g.batch * g.out_h * g.out_w;
    const Tensor<float> y = random_tensor({rows, g.out_c}, 9);
    const Tensor<float> dy = random_tensor({rows, g.out_c}, 10);
    std::vector<Tensor<float>> bias_gradients;
    for (const std::size_t threads : {1, 2, 3, 5}) {
      CpuBackend backend(threads);
      Tensor<float> dkernel(kernel.shape()), dbias({g.out_c});
      backend.conv2d_backward(x, g, kernel, Tensor<float>(), keras::Activation::relu, y, dy,
                              dkernel, dbias, Tensor<float>(), true);
      bias_gradients.push_back(dbias);
      // The same thread count gives the same bits.
      Tensor<float> again_kernel(kernel.shape()), again_bias({g.out_c});
      backend.conv2d_backward(x, g, kernel, Tensor<float>(), keras::Activation::relu, y, dy,
                              again_kernel, again_bias, Tensor<float>(), false);
      CHECK(again_kernel == dkernel);
      CHECK(again_bias == dbias);
    }
    for (const auto& dbias : bias_gradients)
      CHECK(dbias == bias_gradients.front());
  }

  TEST_CASE("Max pooling's gradient goes to the first maximum of each window") {
    // 17 channels: 16 in one vector and one more; one 2x2 window per image.
    constexpr std::size_t channels = 17;
    Pool2DGeometry g;
    g.batch = 1;
    g.in_h = g.in_w = 2;
    g.channels = channels;
    g.out_h = g.out_w = 1;
    g.pool_h = g.pool_w = 2;
    g.stride_h = g.stride_w = 2;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    // Channel c: 0 all equal (first pixel wins), 1 maximum at the last pixel, 2 a tie between
    // the second and the fourth pixel (second wins), 3 NaN first (first keeps the gradient), 4 a
    // NaN later (ignored), the rest the maximum at pixel c % 4.
    Tensor<float> x({1, 2, 2, channels});
    for (std::size_t c = 0; c < channels; ++c) {
      float pixel[4] = {0.0F, 0.0F, 0.0F, 0.0F};
      switch (c) {
        case 0:
          pixel[0] = pixel[1] = pixel[2] = pixel[3] = 1.5F;
          break;
        case 1:
          pixel[3] = 2.0F;
          break;
        case 2:
          pixel[1] = pixel[3] = 3.0F;
          break;
        case 3:
          pixel[0] = nan;
          pixel[2] = 5.0F;
          break;
        case 4:
          pixel[1] = nan;
          pixel[2] = 4.0F;
          break;
        default:
          pixel[c % 4] = 1.0F;
      }
      for (std::size_t p = 0; p < 4; ++p)
        x.data()[p * channels + c] = pixel[p];
    }
    const std::size_t expected[channels] = {0, 3, 1, 0, 2, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0};
    Tensor<float> dy({1, 1, 1, channels});
    for (std::size_t c = 0; c < channels; ++c)
      dy.data()[c] = static_cast<float>(c + 1);
    for (const std::size_t threads : {1, 2}) {
      CpuBackend backend(threads);
      Tensor<float> dx({1, 2, 2, channels});
      dx.data()[0] = 99.0F;  // overwritten, not accumulated
      backend.max_pool_backward(x, g, dy, dx);
      for (std::size_t c = 0; c < channels; ++c) {
        for (std::size_t p = 0; p < 4; ++p) {
          CAPTURE(c);
          CAPTURE(p);
          CHECK(dx.data()[p * channels + c] == (p == expected[c] ? dy.data()[c] : 0.0F));
        }
      }
    }
  }
}
