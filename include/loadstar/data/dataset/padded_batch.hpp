/// \file
/// `padded_batch` and `bucket_by_sequence_length`: tensors of different shapes batched by padding.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/stack.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar {

/// The shape a padded batch pads each element to, as tf.data's `padded_shapes`: one entry per
/// axis of the element, `-1` for an axis padded to the longest in the batch. The default (no
/// dims given) pads every axis to the batch's longest.
/// \code
/// PaddedShape any;            // every axis to the batch maximum
/// PaddedShape fixed{-1, 16};  // axis 0 to the batch maximum, axis 1 to 16
/// \endcode
struct PaddedShape {
  PaddedShape() = default;
  /// Throws `ConfigError` for a dim below -1.
  PaddedShape(std::initializer_list<std::int64_t> d) : PaddedShape(std::vector<std::int64_t>(d)) {}
  explicit PaddedShape(std::vector<std::int64_t> d) : dims(std::move(d)), given(true) {
    for (std::size_t i = 0; i < dims.size(); ++i) {
      if (dims[i] < -1) {
        throw ConfigError("padded_shapes: axis " + std::to_string(i) +
                          " must be -1 (the batch maximum) or a size but is " +
                          std::to_string(dims[i]));
      }
    }
  }
  std::vector<std::int64_t> dims;
  bool given = false;  // False: every axis is padded to the batch maximum.
};

namespace detail {

/// Stacks tensors of one rank into a batch padded with `value` to `spec` (unknown axes to the
/// batch maximum, or to `unknown_to` when given); throws `ShapeError` naming `op` for a rank
/// other than the spec's or an element larger than a fixed padded size.
template <TensorElement T>
Tensor<T> pad_stack(const std::vector<Tensor<T>>& elements, const PaddedShape& spec, T value,
                    std::optional<std::size_t> unknown_to, const char* op) {
  const std::size_t n = elements.size();
  const std::size_t rank = n == 0 ? spec.dims.size() : elements[0].rank();
  if (spec.given && spec.dims.size() != rank) {
    throw ShapeError(std::string(op) + ": padded_shapes has rank " +
                     std::to_string(spec.dims.size()) + " but element 0 has shape " +
                     elements[0].shape().str());
  }
  std::vector<std::size_t> target(rank, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& shape = elements[i].shape();
    if (shape.rank() != rank) {
      throw ShapeError(std::string(op) + ": element " + std::to_string(i) + " has shape " +
                       shape.str() + " but element 0 has rank " + std::to_string(rank));
    }
    for (std::size_t a = 0; a < rank; ++a)
      target[a] = std::max(target[a], shape[a]);
  }
  for (std::size_t a = 0; a < rank; ++a) {
    const bool fixed = spec.given && spec.dims[a] >= 0;
    const std::size_t to = fixed        ? static_cast<std::size_t>(spec.dims[a])
                           : unknown_to ? *unknown_to
                                        : target[a];
    if (target[a] > to) {
      for (std::size_t i = 0; i < n; ++i) {
        if (elements[i].shape()[a] > to) {
          throw ShapeError(std::string(op) + ": element " + std::to_string(i) + " has shape " +
                           elements[i].shape().str() + ", larger than the padded size " +
                           std::to_string(to) + " of axis " + std::to_string(a));
        }
      }
    }
    target[a] = to;
  }
  const Shape row_shape(target);
  Tensor<T> out(row_shape.prepend(n), value);
  const std::size_t row_size = row_shape.elements();
  for (std::size_t i = 0; i < n; ++i) {
    const Tensor<T>& e = elements[i];
    T* dst = out.data() + i * row_size;
    if (rank == 0) {
      *dst = *e.data();
      continue;
    }
    const std::size_t run = e.shape()[rank - 1];
    const std::size_t runs = run == 0 ? 0 : e.size() / run;
    std::vector<std::size_t> index(rank, 0);  // Index of the run's first element.
    for (std::size_t r = 0; r < runs; ++r) {
      std::size_t offset = 0;
      for (std::size_t a = 0; a < rank; ++a)
        offset = offset * target[a] + index[a];
      std::memcpy(dst + offset, e.data() + r * run, run * sizeof(T));
      for (std::size_t a = rank - 1; a-- > 0;) {
        if (++index[a] < e.shape()[a]) break;
        index[a] = 0;
      }
    }
  }
  return out;
}

/// How elements of type `E` (a tensor, or a tuple of tensors) are padded into a batch: one
/// `PaddedShape` per member.
template <class E>
struct Padder;

template <TensorElement T>
struct Padder<Tensor<T>> {
  using batch_type = Tensor<T>;
  static constexpr std::size_t members = 1;
  static batch_type pad(const std::vector<Tensor<T>>& elements,
                        const std::vector<PaddedShape>& specs, double value,
                        std::optional<std::size_t> unknown_to, const char* op) {
    return pad_stack(elements, specs[0], static_cast<T>(value), unknown_to, op);
  }
};

template <TensorElement... T>
struct Padder<std::tuple<Tensor<T>...>> {
  using batch_type = std::tuple<Tensor<T>...>;
  static constexpr std::size_t members = sizeof...(T);
  static batch_type pad(const std::vector<std::tuple<Tensor<T>...>>& elements,
                        const std::vector<PaddedShape>& specs, double value,
                        std::optional<std::size_t> unknown_to, const char* op) {
    return pad_members(elements, specs, value, unknown_to, op, std::index_sequence_for<T...>{});
  }

 private:
  template <std::size_t... I>
  static batch_type pad_members(const std::vector<std::tuple<Tensor<T>...>>& elements,
                                const std::vector<PaddedShape>& specs, double value,
                                std::optional<std::size_t> unknown_to, const char* op,
                                std::index_sequence<I...>) {
    return batch_type{pad_member<I>(elements, specs[I], value, unknown_to, op)...};
  }
  template <std::size_t I>
  static auto pad_member(const std::vector<std::tuple<Tensor<T>...>>& elements,
                         const PaddedShape& spec, double value,
                         std::optional<std::size_t> unknown_to, const char* op) {
    using M = std::tuple_element_t<I, std::tuple<Tensor<T>...>>;
    std::vector<M> column;
    column.reserve(elements.size());
    for (const auto& e : elements)
      column.push_back(std::get<I>(e));
    return pad_stack(column, spec, static_cast<typename M::value_type>(value), unknown_to, op);
  }
};

template <class E>
concept Paddable = requires {
  Padder<E>::members;
};

/// One padded shape per member of the elements: `given` of them, or the default for all when
/// none is given; throws `ConfigError` naming `op` for another count.
inline std::vector<PaddedShape> padded_specs(std::vector<PaddedShape> given, std::size_t members,
                                             const char* op) {
  if (given.empty()) return std::vector<PaddedShape>(members);
  if (given.size() != members) {
    throw ConfigError(std::string(op) + ": padded_shapes has " + std::to_string(given.size()) +
                      " shapes but the elements have " + std::to_string(members) + " members");
  }
  return given;
}
inline std::vector<PaddedShape> padded_specs(PaddedShape given, std::size_t members,
                                             const char* op) {
  std::vector<PaddedShape> list;
  if (given.given) list.push_back(std::move(given));
  return padded_specs(std::move(list), members, op);
}

}  // namespace detail

/// Batches of `batch_size` tensors of one rank and different shapes, each padded with
/// `padding_value` to `padded_shapes` (an axis of -1, or every axis by default, to the longest
/// of the batch), as `tf.data.Dataset.padded_batch`; the last batch is partial unless
/// `drop_remainder`. Elements are tensors, or tuples of tensors padded member by member (then
/// `padded_shapes` is a `std::vector<PaddedShape>` with one shape per member, and the one
/// `padding_value`, converted to each member's type, pads them all). An element of another
/// rank, or larger than a fixed padded size, throws `ShapeError`. The state is the upstream's (a
/// batch is built within one `next()`).
/// \code
/// auto batches = sentences.padded_batch(32, {-1}, 0);   // (32, longest of the 32)
/// \endcode
template <Dataset D>
class PaddedBatchDataset : public DatasetBase<PaddedBatchDataset<D>> {
  static_assert(detail::Paddable<element_t<D>>,
                "padded_batch: elements must be tensors or tuples of tensors");
  using E = element_t<D>;

 public:
  using element_type = typename detail::Padder<E>::batch_type;

  /// Throws `ConfigError` for a batch size of 0 and for padded shapes of another count than the
  /// elements' members.
  template <class P>
  PaddedBatchDataset(D upstream, std::size_t batch_size, P padded_shapes, double padding_value,
                     bool drop_remainder)
      : upstream_(std::move(upstream)),
        batch_size_(batch_size),
        specs_(detail::padded_specs(std::move(padded_shapes), detail::Padder<E>::members,
                                    "padded_batch")),
        value_(padding_value),
        drop_remainder_(drop_remainder) {
    if (batch_size == 0) throw ConfigError("padded_batch: batch_size must be positive but is 0");
  }

  std::optional<element_type> next() {
    std::vector<E> pending;
    pending.reserve(batch_size_);
    while (pending.size() < batch_size_) {
      auto element = upstream_.next();
      if (!element) break;
      pending.push_back(std::move(*element));
    }
    if (pending.empty() || (drop_remainder_ && pending.size() < batch_size_)) return std::nullopt;
    return detail::Padder<E>::pad(pending, specs_, value_, std::nullopt, "padded_batch");
  }
  void reset() { upstream_.reset(); }
  nlohmann::json state() const { return {{"op", "padded_batch"}, {"upstream", upstream_.state()}}; }
  void restore(const nlohmann::json& state) {
    upstream_.restore(detail::expect_state(state, "padded_batch")["upstream"]);
  }

 private:
  D upstream_;
  std::size_t batch_size_;
  std::vector<PaddedShape> specs_;
  double value_;
  bool drop_remainder_;
};

/// Options of `bucket_by_sequence_length` after its three required arguments, with tf.data's
/// names and defaults.
struct BucketOptions {
  /// The shapes each bucket's batch is padded to, one per member of the elements (see
  /// `PaddedShape`); none: every axis to the batch maximum.
  std::vector<PaddedShape> padded_shapes = {};
  /// The padding value (converted to the element type).
  double padding_value = 0;
  /// Pads the unknown axes to the bucket's boundary minus one instead of the batch maximum; an
  /// element of the last bucket (length at least the largest boundary) is then refused.
  bool pad_to_bucket_boundary = false;
  /// Stacks without padding (every element of a batch must have the same shape).
  bool no_padding = false;
  /// Drops each bucket's partial batch at the end of the epoch.
  bool drop_remainder = false;
};

/// Elements of `D` grouped by length into buckets and batched per bucket, as
/// `tf.data.Dataset.bucket_by_sequence_length`: an element of length `l =
/// element_length_func(e)` goes to bucket `i` with `bucket_boundaries[i-1] <= l <
/// bucket_boundaries[i]` (the first and last buckets are open-ended); a bucket that holds
/// `bucket_batch_sizes[i]` elements is yielded as a padded batch (see `PaddedBatchDataset`). At
/// the end of the epoch the partial buckets are yielded in bucket order unless `drop_remainder`.
///
/// State: like `shuffle`'s, the upstream's state where the buckets were last all empty and the
/// number of elements taken and batches yielded since; a restore replays the upstream from there
/// (grouping again, without padding the replayed batches).
/// \code
/// auto batches = sentences.bucket_by_sequence_length(
///     [](const Tensor<std::int32_t>& s) { return s.dim(0); }, {10, 20}, {64, 32, 16});
/// \endcode
template <Dataset D, class L>
class BucketBySequenceLengthDataset : public DatasetBase<BucketBySequenceLengthDataset<D, L>> {
  static_assert(detail::Paddable<element_t<D>>,
                "bucket_by_sequence_length: elements must be tensors or tuples of tensors");
  static_assert(std::is_invocable_v<const L&, const element_t<D>&>,
                "bucket_by_sequence_length: element_length_func must take an element");
  using E = element_t<D>;

 public:
  using element_type = typename detail::Padder<E>::batch_type;

  /// Throws `ConfigError` for unsorted boundaries, batch sizes not one more than the boundaries
  /// or of 0, and padding options given with `no_padding`.
  BucketBySequenceLengthDataset(D upstream, L length, std::vector<std::int64_t> boundaries,
                                std::vector<std::size_t> batch_sizes, BucketOptions options)
      : upstream_(std::move(upstream)),
        length_(std::move(length)),
        boundaries_(std::move(boundaries)),
        batch_sizes_(std::move(batch_sizes)),
        options_(std::move(options)) {
    if (!std::is_sorted(boundaries_.begin(), boundaries_.end())) {
      throw ConfigError("bucket_by_sequence_length: bucket_boundaries must be sorted but are " +
                        nlohmann::json(boundaries_).dump());
    }
    if (batch_sizes_.size() != boundaries_.size() + 1) {
      throw ConfigError("bucket_by_sequence_length: bucket_batch_sizes must have " +
                        std::to_string(boundaries_.size() + 1) +
                        " entries (one more than bucket_boundaries) but has " +
                        std::to_string(batch_sizes_.size()));
    }
    for (std::size_t i = 0; i < batch_sizes_.size(); ++i) {
      if (batch_sizes_[i] == 0) {
        throw ConfigError("bucket_by_sequence_length: bucket_batch_sizes[" + std::to_string(i) +
                          "] must be positive but is 0");
      }
    }
    if (options_.no_padding && (!options_.padded_shapes.empty() || options_.padding_value != 0 ||
                                options_.pad_to_bucket_boundary)) {
      throw ConfigError(
          "bucket_by_sequence_length: no_padding is set, so padded_shapes, padding_value and "
          "pad_to_bucket_boundary must be left at their defaults");
    }
    specs_ = detail::padded_specs(options_.padded_shapes, detail::Padder<E>::members,
                                  "bucket_by_sequence_length");
    buckets_.resize(batch_sizes_.size());
    start_ = upstream_.state();
  }

  std::optional<element_type> next() { return step(true); }

  void reset() {
    upstream_.reset();
    clear();
  }
  nlohmann::json state() const {
    return {{"op", "bucket_by_sequence_length"},
            {"start", start_},
            {"taken", taken_},
            {"yielded", yielded_}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "bucket_by_sequence_length");
    const std::size_t taken = s["taken"], yielded = s["yielded"];
    if (taken != 0) {
      detail::require_same_shards(s["start"], upstream_.state(), "bucket_by_sequence_length");
    }
    upstream_.restore(s["start"]);
    clear();
    while (yielded_ < yielded) {
      if (!step(false)) {
        throw CheckpointError("bucket_by_sequence_length: state is at batch " +
                              std::to_string(yielded) + " but the epoch ended after " +
                              std::to_string(yielded_));
      }
    }
    if (taken_ != taken) {
      throw CheckpointError("bucket_by_sequence_length: state took " + std::to_string(taken) +
                            " elements to its batch " + std::to_string(yielded) +
                            " but the upstream gave " + std::to_string(taken_));
    }
  }

 private:
  void clear() {
    for (auto& b : buckets_)
      b.clear();
    start_ = upstream_.state();
    taken_ = yielded_ = 0;
    ended_ = false;
  }

  std::size_t bucket_of(const element_t<D>& e) const {
    const auto l = static_cast<std::int64_t>(std::invoke(length_, e));
    std::size_t i = 0;
    while (i < boundaries_.size() && l >= boundaries_[i])
      ++i;
    if (options_.pad_to_bucket_boundary && i == boundaries_.size()) {
      throw ShapeError("bucket_by_sequence_length: an element has length " + std::to_string(l) +
                       " but with pad_to_bucket_boundary elements must be shorter than the "
                       "largest boundary " +
                       (boundaries_.empty() ? std::string("(there are none)")
                                            : std::to_string(boundaries_.back())));
    }
    return i;
  }

  // The next batch (built only when `build`), or nothing at the end of the epoch.
  std::optional<element_type> step(bool build) {
    while (!ended_) {
      auto element = upstream_.next();
      if (!element) {
        ended_ = true;
        break;
      }
      ++taken_;
      const std::size_t b = bucket_of(*element);
      buckets_[b].push_back(std::move(*element));
      if (buckets_[b].size() == batch_sizes_[b]) return emit(b, build);
    }
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      if (buckets_[b].empty()) continue;
      if (options_.drop_remainder) {
        buckets_[b].clear();
        continue;
      }
      return emit(b, build);
    }
    return std::nullopt;
  }

  std::optional<element_type> emit(std::size_t b, bool build) {
    std::vector<E> elements = std::move(buckets_[b]);
    buckets_[b].clear();
    ++yielded_;
    if (!ended_ && std::all_of(buckets_.begin(), buckets_.end(),
                               [](const auto& bucket) { return bucket.empty(); })) {
      // Nothing is held: a restore can start from here.
      start_ = upstream_.state();
      taken_ = yielded_ = 0;
    }
    if (!build) return element_type();
    if (options_.no_padding) return detail::Stacker<E>::stack(elements);
    std::optional<std::size_t> unknown_to;
    if (options_.pad_to_bucket_boundary) {
      unknown_to = static_cast<std::size_t>(std::max<std::int64_t>(boundaries_[b] - 1, 0));
    }
    return detail::Padder<E>::pad(elements, specs_, options_.padding_value, unknown_to,
                                  "bucket_by_sequence_length");
  }

  D upstream_;
  L length_;
  std::vector<std::int64_t> boundaries_;
  std::vector<std::size_t> batch_sizes_;
  BucketOptions options_;
  std::vector<PaddedShape> specs_;
  std::vector<std::vector<E>> buckets_;
  nlohmann::json start_;
  std::size_t taken_ = 0;    // Upstream elements taken since `start_`.
  std::size_t yielded_ = 0;  // Batches yielded since `start_`.
  bool ended_ = false;
};

}  // namespace loadstar
