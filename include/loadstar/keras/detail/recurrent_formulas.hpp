/// \file
/// The gate arithmetic of Keras's recurrent cells (`SimpleRNN`, `LSTM`, `GRU`) for one element
/// `j` of one batch row, forward and backward. A row of gates holds `k * units` values in Keras's
/// gate order (LSTM `i, f, c, o`; GRU `z, r, h`), unit `j` of gate `g` at `g * units + j`.
/// Host and device code (`LOADSTAR_HOST_DEVICE`): the recurrent layers' kernels on every backend
/// call these same functions.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>

#include "loadstar/keras/detail/activation_formulas.hpp"

namespace loadstar::keras::detail {

/// The activations of a recurrent cell: `activation` (tanh by default) and
/// `recurrent_activation` (sigmoid by default; Keras 2.0's hard_sigmoid in old files).
struct RecurrentActivations {
  Activation activation = Activation::tanh;
  Activation recurrent = Activation::sigmoid;
};

/// `SimpleRNN`: `h = activation(z)` with `z = x W + h_prev U + b`.
LOADSTAR_HOST_DEVICE inline float simple_rnn_value(float z, RecurrentActivations a) noexcept {
  return activate(a.activation, z);
}

/// The gradient of `simple_rnn_value` at `z` (output `h`) times `dh`.
LOADSTAR_HOST_DEVICE inline float simple_rnn_gradient(float z, float h, float dh,
                                                      RecurrentActivations a) noexcept {
  return activation_gradient(a.activation, z, h, dh);
}

/// `LSTM` element `j`: from the pre-activations `z` (`4 * units`: `x W + h_prev U + b`) and the
/// previous carry, `c = f * c_prev + i * g` and `h = o * activation(c)` with `i, f, o` the
/// recurrent activation and `g` the activation of their gates (keras
/// `LSTMCell._compute_carry_and_output_fused`).
LOADSTAR_HOST_DEVICE inline void lstm_forward(const float* z, std::size_t units, std::size_t j,
                                              float c_prev, RecurrentActivations a, float& c,
                                              float& h) noexcept {
  const float i = activate(a.recurrent, z[j]);
  const float f = activate(a.recurrent, z[units + j]);
  const float g = activate(a.activation, z[2 * units + j]);
  const float o = activate(a.recurrent, z[3 * units + j]);
  c = f * c_prev + i * g;
  h = o * activate(a.activation, c);
}

/// The backward step of `lstm_forward` for element `j`: from the gradient `dh` of `h` and `dc`
/// of `c` (carried from the next step), writes the pre-activations' gradients into `dz` and
/// returns the gradient of `c_prev`.
LOADSTAR_HOST_DEVICE inline float lstm_backward(const float* z, std::size_t units, std::size_t j,
                                                float c_prev, float c, float dh, float dc,
                                                RecurrentActivations a, float* dz) noexcept {
  const float zi = z[j], zf = z[units + j], zg = z[2 * units + j], zo = z[3 * units + j];
  const float i = activate(a.recurrent, zi);
  const float f = activate(a.recurrent, zf);
  const float g = activate(a.activation, zg);
  const float o = activate(a.recurrent, zo);
  const float ac = activate(a.activation, c);
  const float dct = dc + activation_gradient(a.activation, c, ac, dh * o);
  dz[j] = activation_gradient(a.recurrent, zi, i, dct * g);
  dz[units + j] = activation_gradient(a.recurrent, zf, f, dct * c_prev);
  dz[2 * units + j] = activation_gradient(a.activation, zg, g, dct * i);
  dz[3 * units + j] = activation_gradient(a.recurrent, zo, o, dh * ac);
  return dct * f;
}

/// `GRU`'s reset gate for element `j`: `r = recurrent_activation(x_r + u_r)` from the input
/// projection `xp` and the recurrent projection `rp` (each `3 * units`).
LOADSTAR_HOST_DEVICE inline float gru_reset(const float* xp, const float* rp, std::size_t units,
                                            std::size_t j, RecurrentActivations a) noexcept {
  return activate(a.recurrent, xp[units + j] + rp[units + j]);
}

/// `GRU` element `j`: `z = ra(x_z + u_z)`, `r = ra(x_r + u_r)`, the candidate
/// `hh = activation(x_h + r * u_h)` (`reset_after`, Keras 2/3's default: `u_h = h_prev U_h + b_rh`
/// is `rp`'s third block) or `activation(x_h + q_h)` (`reset_after=False`, Keras 1: `q_h =
/// (r * h_prev) U_h`, given as `rq`'s third block), and `h = z * h_prev + (1 - z) * hh`.
LOADSTAR_HOST_DEVICE inline float gru_forward(const float* xp, const float* rp, const float* rq,
                                              std::size_t units, std::size_t j, float h_prev,
                                              bool reset_after, RecurrentActivations a) noexcept {
  const float z = activate(a.recurrent, xp[j] + rp[j]);
  const float r = gru_reset(xp, rp, units, j, a);
  const float pre = reset_after ? xp[2 * units + j] + r * rp[2 * units + j]
                                : xp[2 * units + j] + rq[2 * units + j];
  const float hh = activate(a.activation, pre);
  return z * h_prev + (1.0F - z) * hh;
}

/// The first backward step of `gru_forward` for element `j` from `dh`: writes the gradients of
/// the input projection's `z` and `h` blocks into `dxp`, and of the recurrent projection into
/// `drp` (`reset_after`: all three blocks, the `r` block's into `dxp` too; otherwise the `z`
/// block, the `h` block's gradient `d(pre)` going to `(r * h_prev) U_h` in `dxp`'s `h` block
/// and the `r` block waiting for `gru_backward_reset`). Returns the direct gradient of `h_prev`,
/// `dh * z`.
LOADSTAR_HOST_DEVICE inline float gru_backward(const float* xp, const float* rp, const float* rq,
                                               std::size_t units, std::size_t j, float h_prev,
                                               float dh, bool reset_after, RecurrentActivations a,
                                               float* dxp, float* drp) noexcept {
  const float zpre = xp[j] + rp[j];
  const float z = activate(a.recurrent, zpre);
  const float rpre = xp[units + j] + rp[units + j];
  const float r = activate(a.recurrent, rpre);
  const float pre = reset_after ? xp[2 * units + j] + r * rp[2 * units + j]
                                : xp[2 * units + j] + rq[2 * units + j];
  const float hh = activate(a.activation, pre);
  const float dz = activation_gradient(a.recurrent, zpre, z, dh * (h_prev - hh));
  const float dpre = activation_gradient(a.activation, pre, hh, dh * (1.0F - z));
  dxp[j] = dz;
  drp[j] = dz;
  dxp[2 * units + j] = dpre;
  if (reset_after) {
    const float dr = activation_gradient(a.recurrent, rpre, r, dpre * rp[2 * units + j]);
    dxp[units + j] = dr;
    drp[units + j] = dr;
    drp[2 * units + j] = dpre * r;
  } else {
    drp[2 * units + j] = 0.0F;
  }
  return dh * z;
}

/// The second backward step of a `reset_after=False` `GRU` for element `j`: from `dq`, the
/// gradient of `q = r * h_prev` (`d(pre) U_h^T`), writes the `r` block's gradient into `dxp`
/// and `drp` and returns `q`'s share of the gradient of `h_prev`, `dq * r`.
LOADSTAR_HOST_DEVICE inline float gru_backward_reset(const float* xp, const float* rp,
                                                     std::size_t units, std::size_t j, float h_prev,
                                                     float dq, RecurrentActivations a, float* dxp,
                                                     float* drp) noexcept {
  const float rpre = xp[units + j] + rp[units + j];
  const float r = activate(a.recurrent, rpre);
  const float dr = activation_gradient(a.recurrent, rpre, r, dq * h_prev);
  dxp[units + j] = dr;
  drp[units + j] = dr;
  return dq * r;
}

}  // namespace loadstar::keras::detail
