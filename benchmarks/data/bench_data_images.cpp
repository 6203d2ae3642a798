// The image pipeline of `benchmarks/run data`: a folder of 2000 JPEGs of 500x375 pixels (quality
// 90, 10 classes), each decoded with torchvision's random resized crop to 224x224 (only the window
// decoded, at a reduced scale where it can), flipped at random, converted to float and batched by
// 64, in two modes:
// - "images/threads/<workers>": a Dataset (from_tensor_slices, shuffle, map_with_seed, batch) with
//   the map on 1 or 2 threads;
// - "images/processes/<workers>": the same work as a Keras Sequence whose batch i decodes its 64
//   images, served by SequenceAdapter on 1 or 2 forked worker processes (Multiprocess), with 2
//   batches in flight per worker, as the peer's DataLoader(prefetch_factor=2).
// The throughput is the counter "rate" (images/s). The folder is written once, reproducibly (the
// same pixels as peers/data_images.py writes with PIL), under $LOADSTAR_BENCH_IMAGES or the
// temporary directory.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <loadstar/data/dataset.hpp>
#include <loadstar/data/image.hpp>
#include <loadstar/data/sequence_adapter.hpp>
#include <loadstar/random.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

using loadstar::Tensor;
namespace fs = std::filesystem;

constexpr int image_count = 2000;
constexpr int classes = 10;
constexpr int width = 500;
constexpr int height = 375;
constexpr std::size_t batch_size = 64;
constexpr std::size_t side = 224;
// The seeds of both modes: the order of the files (1) and the crops and flips (2).
constexpr std::uint64_t shuffle_seed = 1;
constexpr std::uint64_t augment_seed = 2;

fs::path images_root() {
  const char* env = std::getenv("LOADSTAR_BENCH_IMAGES");
  return env != nullptr ? fs::path(env) : fs::temp_directory_path() / "loadstar-bench-images-2000";
}

// Image i's pixels: smooth waves with a hashed texture, as peers/data_images.py computes them.
std::vector<std::uint8_t> pixels_of(int i) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(width) * height * 3);
  std::size_t p = 0;
  for (std::uint32_t y = 0; y < height; ++y) {
    for (std::uint32_t x = 0; x < width; ++x) {
      const std::uint32_t noise =
          ((x * 73856093u) ^ (y * 19349663u) ^ (static_cast<std::uint32_t>(i) * 83492791u)) % 41u;
      for (int k = 0; k < 3; ++k) {
        const double wave = 100.0 * std::sin((x * (k + 1.0) + y * (3.0 - k) + 17.0 * i) / 23.0);
        const long v = std::lround(128.0 + wave) + static_cast<long>(noise) - 20;
        out[p++] = static_cast<std::uint8_t>(std::clamp(v, 0L, 255L));
      }
    }
  }
  return out;
}

void write_jpeg(const fs::path& path, const std::vector<std::uint8_t>& pixels) {
  jpeg_compress_struct info{};
  jpeg_error_mgr errors{};
  info.err = jpeg_std_error(&errors);  // a benchmark's setup: libjpeg's exit on error is fine
  jpeg_create_compress(&info);
  FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    std::perror(path.c_str());
    std::exit(1);
  }
  jpeg_stdio_dest(&info, file);
  info.image_width = width;
  info.image_height = height;
  info.input_components = 3;
  info.in_color_space = JCS_RGB;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, 90, TRUE);
  jpeg_start_compress(&info, TRUE);
  while (info.next_scanline < info.image_height) {
    JSAMPROW row = const_cast<std::uint8_t*>(pixels.data()) +
                   static_cast<std::size_t>(info.next_scanline) * width * 3;
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  jpeg_destroy_compress(&info);
  std::fclose(file);
}

// The folder <root>/class<c>/<i>.jpg, written under a temporary name and renamed into place.
void ensure_images(const fs::path& root) {
  if (fs::exists(root / "complete")) return;
  const fs::path partial = root.string() + ".partial";
  fs::remove_all(partial);
  for (int i = 0; i < image_count; ++i) {
    const fs::path dir = partial / ("class" + std::to_string(i % classes));
    fs::create_directories(dir);
    write_jpeg(dir / (std::to_string(i) + ".jpg"), pixels_of(i));
  }
  std::ofstream(partial / "complete") << image_count << "\n";
  fs::remove_all(root);
  fs::rename(partial, root);
}

std::vector<std::string> list_images(const fs::path& root) {
  std::vector<std::string> paths;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (entry.path().extension() == ".jpg") paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

// The image at `path`, cropped, resized and flipped with the randomness of `seed`; both modes call
// it, so they do the same work.
Tensor<float> load_augment(const std::string& path, std::uint64_t seed) {
  const auto bytes = loadstar::image::read_file(path);
  auto image = loadstar::image::decode_random_resized_crop(bytes, side, side, seed, 3, path);
  return loadstar::image::random_flip_left_right(image, seed ^ loadstar::golden_gamma);
}

// The map of the thread rows: a file's index to its augmented image and class.
struct LoadAugment {
  std::shared_ptr<const std::vector<std::string>> paths;
  std::pair<Tensor<float>, std::int64_t> operator()(const Tensor<std::int64_t>& row,
                                                    std::uint64_t seed) const {
    const auto i = static_cast<std::size_t>(row.data()[0]);
    return {load_augment((*paths)[i], seed), static_cast<std::int64_t>(i % classes)};
  }
};

// The process rows' Keras Sequence: batch `index` of epoch `e` holds the files at positions
// 64 index .. 64 index + 63 of epoch e's permutation of the folder (`epoch_permutation` with
// `shuffle_seed`), the one at position p cropped and flipped with `element_seed(augment_seed, e,
// p)`, as `map_with_seed` seeds the thread rows' elements. So a batch is a function of (epoch,
// index) alone, whichever worker process builds it; `set_epoch` runs on the consumer before the
// adapter forks the workers of that epoch (so prefetch stops at the end of each 31-batch epoch, as
// the peer's DataLoader iterator does). The remainder of the files (2000 = 31 x 64 + 16) is
// left out, as the thread rows' `batch(64, true)` and the peer's `drop_last` do.
class ImageBatches {
 public:
  explicit ImageBatches(std::shared_ptr<const std::vector<std::string>> paths)
      : paths_(std::move(paths)) {}

  std::size_t size() const { return paths_->size() / batch_size; }
  void set_epoch(std::uint64_t epoch) {
    epoch_ = epoch;
    order_ = loadstar::epoch_permutation(paths_->size(), shuffle_seed, epoch, true);
  }
  std::pair<Tensor<float>, Tensor<std::int64_t>> operator[](std::size_t index) const {
    constexpr std::size_t image_floats = side * side * 3;
    // In a worker process a tensor this large is allocated in the slot the consumer reads it
    // from: the images are copied once, into the batch, as `batch` stacks them.
    auto x = Tensor<float>::uninitialized(loadstar::Shape{batch_size, side, side, 3});
    auto y = Tensor<std::int64_t>::uninitialized(loadstar::Shape{batch_size});
    for (std::size_t k = 0; k < batch_size; ++k) {
      const std::size_t position = index * batch_size + k;
      const std::size_t i = order_[position];
      const auto image =
          load_augment((*paths_)[i], loadstar::element_seed(augment_seed, epoch_, position));
      std::copy_n(image.data(), image_floats, x.data() + k * image_floats);
      y.data()[k] = static_cast<std::int64_t>(i % classes);
    }
    return {std::move(x), std::move(y)};
  }

 private:
  std::shared_ptr<const std::vector<std::string>> paths_;
  std::uint64_t epoch_ = 0;
  std::vector<std::size_t> order_;  // epoch_'s permutation of the files
};

// A process row: `ImageBatches` on `Workers` forked worker processes.
template <std::size_t Workers>
void process_rows(benchmark::State& s, std::shared_ptr<const std::vector<std::string>> paths) {
  // The batch 0 that measures the slot is built here, before the workers are forked.
  loadstar::SequenceAdapter<ImageBatches, Workers, true> adapter(ImageBatches{std::move(paths)},
                                                                 {.max_queue_size = 2 * Workers});
  // Warm up as the peer does (3 batches): the workers forked, the files in the page cache.
  for (int i = 0; i < 3; ++i)
    benchmark::DoNotOptimize(adapter.next());
  std::size_t images = 0;
  for (auto _ : s) {
    benchmark::DoNotOptimize(adapter.next());  // an infinite stream of epochs
    images += batch_size;
  }
  s.counters["rate"] = benchmark::Counter(static_cast<double>(images), benchmark::Counter::kIsRate);
  s.SetLabel("images/s");
}

void register_images(std::shared_ptr<const std::vector<std::string>> paths) {
  for (std::size_t workers : {1u, 2u}) {
    const std::string name = "images/threads/" + std::to_string(workers);
    benchmark::RegisterBenchmark(name.c_str(), [paths, workers](benchmark::State& s) {
      const auto n = paths->size();
      Tensor<std::int64_t> files(loadstar::Shape{n});
      for (std::size_t i = 0; i < n; ++i)
        files.data()[i] = static_cast<std::int64_t>(i);
      auto pipeline =
          loadstar::from_tensor_slices(files)
              .shuffle(n, shuffle_seed)
              .map_with_seed(LoadAugment{paths}, augment_seed,
                             loadstar::MapOptions{.num_parallel_calls = workers, .window = 64})
              .batch(batch_size, true);
      // Warm up as the peer does (3 batches): the threads started, the files in the page cache.
      for (int i = 0; i < 3; ++i)
        benchmark::DoNotOptimize(pipeline.next());
      std::size_t images = 0;
      for (auto _ : s) {
        auto batch = pipeline.next();
        if (!batch) {
          pipeline.reset();
          batch = pipeline.next();
        }
        benchmark::DoNotOptimize(batch);
        images += batch_size;
      }
      s.counters["rate"] =
          benchmark::Counter(static_cast<double>(images), benchmark::Counter::kIsRate);
      s.SetLabel("images/s");
    })->UseRealTime();
  }
  benchmark::RegisterBenchmark("images/processes/1", [paths](benchmark::State& s) {
    process_rows<1>(s, paths);
  })->UseRealTime();
  benchmark::RegisterBenchmark("images/processes/2", [paths](benchmark::State& s) {
    process_rows<2>(s, paths);
  })->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  // Listing the names writes no images.
  bool listing = false;
  for (int i = 1; i < argc; ++i)
    listing = listing || std::string(argv[i]).starts_with("--benchmark_list_tests");
  benchmark::Initialize(&argc, argv);
  const fs::path root = images_root();
  if (!listing) ensure_images(root);
  register_images(std::make_shared<const std::vector<std::string>>(
      listing ? std::vector<std::string>{} : list_images(root)));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
