/// \file
/// `window`: overlapping or strided groups of consecutive elements.
#pragma once

#include <cstddef>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// Windows of the elements of `D`, as `tf.data.Dataset.window(size, shift, stride,
/// drop_remainder)`: window `k` holds the elements `k * shift + i * stride` for `i < size`. In
/// tf.data each window is itself a dataset; here it is a `std::vector` of its elements (which is
/// what `window(...).flat_map(lambda w: w.batch(size))` produces there). At the end of the
/// epoch the windows that start before the end but are cut short are yielded partial unless
/// `drop_remainder`. `shift` of 0 means `size` (tf.data's `shift=None`).
///
/// State: the upstream's state before the first element of the next window (recorded with each
/// buffered element, so nothing is replayed) and the elements still to skip when `shift`
/// exceeds the window's span.
/// \code
/// auto w = range(7).window(3, 2);   // {0,1,2}, {2,3,4}, {4,5,6}, {6}
/// \endcode
template <Dataset D>
class WindowDataset : public DatasetBase<WindowDataset<D>> {
 public:
  using element_type = std::vector<element_t<D>>;

  /// Throws `ConfigError` for a `size` or `stride` of 0.
  WindowDataset(D upstream, std::size_t size, std::size_t shift, std::size_t stride,
                bool drop_remainder)
      : upstream_(std::move(upstream)),
        size_(size),
        shift_(shift == 0 ? size : shift),
        stride_(stride),
        drop_remainder_(drop_remainder) {
    if (size == 0) throw ConfigError("window: size must be positive but is 0");
    if (stride == 0) throw ConfigError("window: stride must be positive but is 0");
  }

  std::optional<element_type> next() {
    const std::size_t span = (size_ - 1) * stride_ + 1;
    while (skip_ > 0 && !ended_) {
      if (!upstream_.next())
        ended_ = true;
      else
        --skip_;
    }
    while (buffer_.size() < span && !ended_) {
      auto before = upstream_.state();
      auto element = upstream_.next();
      if (!element) {
        ended_ = true;
        break;
      }
      buffer_.push_back({std::move(before), std::move(*element)});
    }
    if (buffer_.empty()) return std::nullopt;
    if (buffer_.size() < span && drop_remainder_) {
      buffer_.clear();
      return std::nullopt;
    }
    element_type window;
    window.reserve(size_);
    for (std::size_t i = 0; i < buffer_.size() && window.size() < size_; i += stride_)
      window.push_back(buffer_[i].element);
    if (shift_ >= buffer_.size()) {
      skip_ = shift_ - buffer_.size();
      buffer_.clear();
    } else {
      buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(shift_));
    }
    return window;
  }
  void reset() {
    upstream_.reset();
    buffer_.clear();
    skip_ = 0;
    ended_ = false;
  }
  nlohmann::json state() const {
    if (!buffer_.empty()) {
      return {{"op", "window"}, {"upstream", buffer_.front().before}, {"skip", 0}};
    }
    return {{"op", "window"}, {"upstream", upstream_.state()}, {"skip", ended_ ? 0 : skip_}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "window");
    upstream_.restore(s["upstream"]);
    skip_ = s["skip"];
    buffer_.clear();
    ended_ = false;
  }

 private:
  struct Buffered {
    nlohmann::json before;  // The upstream's state before this element.
    element_t<D> element;
  };

  D upstream_;
  std::size_t size_;
  std::size_t shift_;
  std::size_t stride_;
  bool drop_remainder_;
  std::deque<Buffered> buffer_;
  std::size_t skip_ = 0;
  bool ended_ = false;
};

}  // namespace loadstar
