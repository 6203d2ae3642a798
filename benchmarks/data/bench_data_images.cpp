// The image pipeline of `benchmarks/run data` ("images/threads/<workers>"): a folder of 2000 JPEGs
// of 500x375 pixels (quality 90, 10 classes), each decoded with torchvision's random resized crop
// to 224x224 (only the window decoded, at a reduced scale where it can), flipped at random,
// converted to float and batched by 64, with the map on 1 or 2 threads. The throughput is the
// counter "rate" (images/s). The folder is written once, reproducibly (the same pixels as
// peers/data_images.py writes with PIL), under $LOADSTAR_BENCH_IMAGES or the temporary directory.
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
#include <memory>
#include <string>
#include <vector>

namespace {

using loadstar::Tensor;
namespace fs = std::filesystem;

constexpr int image_count = 2000;
constexpr int classes = 10;
constexpr int width = 500;
constexpr int height = 375;

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

struct LoadAugment {
  std::shared_ptr<const std::vector<std::string>> paths;
  std::pair<Tensor<float>, std::int64_t> operator()(const Tensor<std::int64_t>& row,
                                                    std::uint64_t seed) const {
    const auto i = static_cast<std::size_t>(row.data()[0]);
    const auto bytes = loadstar::image::read_file((*paths)[i]);
    auto image = loadstar::image::decode_random_resized_crop(bytes, 224, 224, seed, 3, (*paths)[i]);
    return {loadstar::image::random_flip_left_right(image, seed ^ 0x9e3779b97f4a7c15ULL),
            static_cast<std::int64_t>(i % classes)};
  }
};

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
              .shuffle(n, 1)
              .map_with_seed(LoadAugment{paths}, 2,
                             loadstar::MapOptions{.num_parallel_calls = workers, .window = 64})
              .batch(64, true);
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
        images += 64;
      }
      s.counters["rate"] =
          benchmark::Counter(static_cast<double>(images), benchmark::Counter::kIsRate);
      s.SetLabel("images/s");
    })->UseRealTime();
  }
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
