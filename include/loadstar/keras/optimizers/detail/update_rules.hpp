/// \file
/// Each built-in optimizer's update rule, written once for every backend. A rule is a function
/// template over its operands' type: the CPU optimizers instantiate it with Eigen arrays (a whole
/// variable or a block of one, vectorised by Eigen), the CUDA kernels with one float per thread
/// whose every operation is rounded as written (`cuda::detail::Rounded`). The arithmetic
/// operators are the operands' own; `Math` gives the rest (`sqrt`, `rsqrt`, `square`, `max`), so
/// that both backends evaluate the same expression tree. The operands are
/// `keras::UpdateOperands` (kinds.hpp); dependency-free, so that nvcc compiles it without the
/// executor's headers.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/backend/kinds.hpp"

namespace loadstar::keras::detail::update_rules {

/// SGD without momentum: `w -= lr * g`.
template <class Math, class W, class G>
LOADSTAR_HOST_DEVICE void sgd(const keras::UpdateOperands& p, W& w, const G& g) {
  w = w - p.learning_rate * g;
}

/// SGD with momentum: `velocity = momentum * velocity - lr * g`, then `w += velocity`, or with
/// Nesterov `w += momentum * velocity - lr * g`.
template <class Math, class W, class G, class S>
LOADSTAR_HOST_DEVICE void sgd_momentum(const keras::UpdateOperands& p, W& w, const G& g,
                                       S& velocity) {
  velocity = p.momentum * velocity - p.learning_rate * g;
  if (p.nesterov) {
    w = w + (p.momentum * velocity - p.learning_rate * g);
  } else {
    w = w + velocity;
  }
}

/// Adam's (and AdamW's) moments: `m += (g - m) * (1 - beta_1)`, `v += (g^2 - v) * (1 - beta_2)`,
/// after AdamW's decay `w -= w * weight_decay`.
template <class Math, class W, class G, class S>
LOADSTAR_HOST_DEVICE void adam_moments(const keras::UpdateOperands& p, W& w, const G& g, S& m,
                                       S& v) {
  if (p.weight_decay != 0.0F) w = w - w * p.weight_decay;
  m = m + (g - m) * p.one_minus_beta_1;
  v = v + (Math::square(g) - v) * p.one_minus_beta_2;
}

/// Adam (Keras 2.11+'s `update_step`, the "epsilon hat" placement):
/// `w -= alpha * m / (sqrt(v) + epsilon)`.
template <class Math, class W, class G, class S>
LOADSTAR_HOST_DEVICE void adam(const keras::UpdateOperands& p, W& w, const G& g, S& m, S& v) {
  adam_moments<Math>(p, w, g, m, v);
  w = w - (m * p.alpha) / (Math::sqrt(v) + p.epsilon);
}

/// Adam with amsgrad: `v_hat = max(v_hat, v)` in place of `v` in the update.
template <class Math, class W, class G, class S>
LOADSTAR_HOST_DEVICE void adam_amsgrad(const keras::UpdateOperands& p, W& w, const G& g, S& m, S& v,
                                       S& v_hat) {
  adam_moments<Math>(p, w, g, m, v);
  v_hat = Math::max(v_hat, v);
  w = w - (m * p.alpha) / (Math::sqrt(v_hat) + p.epsilon);
}

/// RMSprop: `velocity = rho * velocity + (1 - rho) * g^2`; centered, also
/// `average = rho * average + (1 - rho) * g`; `increment = lr * g / sqrt(velocity [- average^2] +
/// epsilon)`, then with momentum `momentum = momentum * momentum + increment; w -= momentum`,
/// else `w -= increment`. `momentum` and `average` are read only when the step has them.
template <class Math, class W, class G, class S>
LOADSTAR_HOST_DEVICE void rmsprop(const keras::UpdateOperands& p, W& w, const G& g, S& velocity,
                                  S& momentum, S& average) {
  velocity = p.rho * velocity + (1.0F - p.rho) * Math::square(g);
  const auto apply = [&](const auto& denominator) {
    const auto increment = p.learning_rate * g * Math::rsqrt(denominator);
    if (p.momentum > 0.0F) {
      momentum = p.momentum * momentum + increment;
      w = w - momentum;
    } else {
      w = w - increment;
    }
  };
  if (p.centered) {
    average = p.rho * average + (1.0F - p.rho) * g;
    apply(velocity - Math::square(average) + p.epsilon);
  } else {
    apply(velocity + p.epsilon);
  }
}

/// Adagrad: `accumulator += g^2; w -= lr * g / sqrt(accumulator + epsilon)`.
template <class Math, class W, class G, class S>
LOADSTAR_HOST_DEVICE void adagrad(const keras::UpdateOperands& p, W& w, const G& g,
                                  S& accumulator) {
  accumulator = accumulator + Math::square(g);
  w = w - p.learning_rate * g * Math::rsqrt(accumulator + p.epsilon);
}

/// Adadelta: `accumulated_grad = rho * accumulated_grad + (1 - rho) * g^2`,
/// `delta = -sqrt(accumulated_delta + epsilon) * g / sqrt(accumulated_grad + epsilon)`,
/// `w += lr * delta`, `accumulated_delta = rho * accumulated_delta + (1 - rho) * delta^2`.
template <class Math, class W, class G, class S>
LOADSTAR_HOST_DEVICE void adadelta(const keras::UpdateOperands& p, W& w, const G& g,
                                   S& accumulated_grad, S& accumulated_delta) {
  const float decay = 1.0F - p.rho;
  accumulated_grad = p.rho * accumulated_grad + decay * Math::square(g);
  // `delta` reads `accumulated_delta` before its update: on arrays it is an expression evaluated
  // where it is used, so `w` is updated first and `accumulated_delta` element by element after.
  const auto delta =
      -Math::sqrt(accumulated_delta + p.epsilon) * g / Math::sqrt(accumulated_grad + p.epsilon);
  w = w + p.learning_rate * delta;
  accumulated_delta = p.rho * accumulated_delta + decay * delta * delta;
}

}  // namespace loadstar::keras::detail::update_rules
