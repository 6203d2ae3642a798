/// \file
/// Each built-in optimizer's update rule, written once for every backend. A rule is a function
/// template over its operands' type: the CPU optimizers instantiate it with Eigen arrays (a whole
/// variable or a block of one, vectorised by Eigen), the CUDA kernels with one float per thread
/// whose every operation is rounded as written (`cuda::detail::Rounded`). The arithmetic
/// operators are the operands' own; `Math` gives the rest (`sqrt`, `rsqrt`, `square`, `abs`,
/// `sign`, `pow` with a float exponent, `max` and `min` with an operand or a float), so
/// that both backends evaluate the same expression tree. The operands are
/// `keras::UpdateOperands` (kinds.hpp); dependency-free, so that nvcc compiles it without the
/// executor's headers.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/backend/kinds.hpp"

namespace loadstar::keras::detail::update_rules {

/// Keras 3's decoupled weight decay (`BaseOptimizer._apply_weight_decay`), which every optimizer
/// applies before its rule: `w -= w * (lr * weight_decay)` (0: none).
template <class Math, class W>
LOADSTAR_HOST_DEVICE void decay_weight(const keras::UpdateOperands& p, W& w) {
  if (p.weight_decay != 0.0F) w = w - w * p.weight_decay;
}

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

/// Adam's (and AdamW's and Nadam's) moments: `m += (g - m) * (1 - beta_1)`,
/// `v += (g^2 - v) * (1 - beta_2)`.
template <class Math, class G, class S>
LOADSTAR_HOST_DEVICE void adam_moments(const keras::UpdateOperands& p, const G& g, S& m, S& v) {
  m = m + (g - m) * p.one_minus_beta_1;
  v = v + (Math::square(g) - v) * p.one_minus_beta_2;
}

/// Adam (Keras 2.11+'s `update_step`, the "epsilon hat" placement):
/// `w -= alpha * m / (sqrt(v) + epsilon)`.
template <class Math, class W, class G, class S>
LOADSTAR_HOST_DEVICE void adam(const keras::UpdateOperands& p, W& w, const G& g, S& m, S& v) {
  adam_moments<Math>(p, g, m, v);
  w = w - (m * p.alpha) / (Math::sqrt(v) + p.epsilon);
}

/// Adam with amsgrad: `v_hat = max(v_hat, v)` in place of `v` in the update.
template <class Math, class W, class G, class S>
LOADSTAR_HOST_DEVICE void adam_amsgrad(const keras::UpdateOperands& p, W& w, const G& g, S& m, S& v,
                                       S& v_hat) {
  adam_moments<Math>(p, g, m, v);
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

/// Nadam (Keras 3's `Nadam.update_step`): Adam's moments, then
/// `m_hat = u_{t+1} m / (1 - prod_{i<=t+1} u_i) + (1 - u_t) g / (1 - prod_{i<=t} u_i)` with
/// `u_t = beta_1 (1 - 0.5 * 0.96^t)`, `v_hat = v / (1 - beta_2^t)`,
/// `w -= m_hat * lr / (sqrt(v_hat) + epsilon)`.
template <class Math, class W, class G, class S>
LOADSTAR_HOST_DEVICE void nadam(const keras::UpdateOperands& p, W& w, const G& g, S& m, S& v) {
  adam_moments<Math>(p, g, m, v);
  w = w - (p.momentum_coefficient * m + p.gradient_coefficient * g) * p.learning_rate /
              (Math::sqrt(v / p.velocity_correction) + p.epsilon);
}

/// Adamax: `m += (g - m) * (1 - beta_1)`, `u = max(beta_2 * u, |g|)`,
/// `w -= alpha * m / (u + epsilon)` with `alpha = lr / (1 - beta_1^t)`.
template <class Math, class W, class G, class S>
LOADSTAR_HOST_DEVICE void adamax(const keras::UpdateOperands& p, W& w, const G& g, S& m, S& u) {
  m = m + (g - m) * p.one_minus_beta_1;
  u = Math::max(p.beta_2 * u, Math::abs(g));
  w = w - (m * p.alpha) / (u + p.epsilon);
}

/// Lion: `w -= lr * sign(beta_1 * m + (1 - beta_1) * g)`, then
/// `m = beta_2 * m + (1 - beta_2) * g`.
template <class Math, class W, class G, class S>
LOADSTAR_HOST_DEVICE void lion(const keras::UpdateOperands& p, W& w, const G& g, S& m) {
  w = w - p.learning_rate * Math::sign(m * p.beta_1 + g * (1.0F - p.beta_1));
  m = m * p.beta_2 + g * (1.0F - p.beta_2);
}

/// Ftrl (Keras 3's `Ftrl.update_step`), with `n = accumulator + g^2` and `q =
/// -learning_rate_power`: `linear += g + 2 l2_shrinkage w - (n^q - accumulator^q) / lr * w`, `w =
/// (clip(linear, -l1, l1) - linear) / (n^q / lr + 2 l2)`, `accumulator = n`.
template <class Math, class W, class G, class S>
LOADSTAR_HOST_DEVICE void ftrl(const keras::UpdateOperands& p, W& w, const G& g, S& accumulator,
                               S& linear) {
  // On arrays `next` is an expression of `accumulator`, which is assigned last.
  const auto next = accumulator + Math::square(g);
  linear = linear +
           ((g + p.twice_l2_shrinkage * w) -
            (Math::pow(next, p.accumulator_power) - Math::pow(accumulator, p.accumulator_power)) /
                p.learning_rate * w);
  const auto quadratic = Math::pow(next, p.accumulator_power) / p.learning_rate + p.twice_l2;
  w = (Math::min(Math::max(linear, -p.l1), p.l1) - linear) / quadratic;
  accumulator = next;
}

}  // namespace loadstar::keras::detail::update_rules
