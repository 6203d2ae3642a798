// The sample-id stream shared by dist_child and its driver: rows whose only feature is their id,
// and one text line per global step listing the ids it covered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <loadstar/keras.hpp>

namespace sample_stream {

constexpr std::size_t rows = 103;        // the last global batch of an epoch has 1 row
constexpr std::size_t global_batch = 6;  // divisible by 1, 2 and 3 ranks
constexpr std::uint64_t seed = 9;

struct Data {
  loadstar::Tensor<float> x;
  loadstar::Tensor<std::int64_t> y;
};

inline Data make() {
  Data d{loadstar::Tensor<float>({rows, 1}), loadstar::Tensor<std::int64_t>({rows})};
  for (std::size_t i = 0; i < rows; ++i) {
    d.x(i, 0) = static_cast<float>(i);
    d.y(i) = 0;
  }
  return d;
}

/// The sample id of row `i` of a batch view of `make()`'s arrays.
inline std::size_t id_of(const loadstar::keras::BatchView& batch, std::size_t i) {
  return batch.rows.empty() ? batch.offset + i : batch.rows[i];
}

/// `epoch: id id id` with the ids in increasing order (each as often as it was seen).
inline std::string line(std::size_t epoch, const std::vector<double>& seen) {
  std::ostringstream out;
  out << epoch << ":";
  for (std::size_t id = 0; id < seen.size(); ++id) {
    for (int k = 0; k < static_cast<int>(seen[id]); ++k)
      out << " " << id;
  }
  return out.str();
}

}  // namespace sample_stream
