// Image decoding, tf.image's operations and Keras's image_dataset_from_directory against the
// references that tests/data/images/generate_images.py wrote with PIL, PyTorch and NumPy; and the
// JPEGs of a TensorFlow-written TFRecord file (tests/data/files/tensorflow/) against PIL.
#include <doctest/doctest.h>

#include <zlib.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <loadstar/data/dataset.hpp>
#include <loadstar/data/example.hpp>
#include <loadstar/data/image.hpp>
#include <loadstar/data/npy.hpp>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "data/dataset/resume_check.hpp"
#include "temp_dir.hpp"
#include "test_helpers.hpp"

using namespace loadstar;
using test_support::contains;

namespace {

std::filesystem::path images_dir() {
  const char* root = std::getenv("LOADSTAR_SOURCE_DIR");
  REQUIRE_MESSAGE(root != nullptr, "LOADSTAR_SOURCE_DIR is not set");
  return std::filesystem::path(root) / "tests" / "data" / "images";
}

std::vector<std::uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

const nlohmann::json& manifest() {
  static const nlohmann::json m = [] {
    std::ifstream in(images_dir() / "reference" / "manifest.json");
    return nlohmann::json::parse(in);
  }();
  return m;
}

template <class A, class B>
double max_abs_diff(const Tensor<A>& a, const Tensor<B>& b) {
  REQUIRE(a.shape() == b.shape());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst,
                     std::abs(static_cast<double>(a.data()[i]) - static_cast<double>(b.data()[i])));
  }
  return worst;
}

template <class A, class B>
double mean_abs_diff(const Tensor<A>& a, const Tensor<B>& b) {
  REQUIRE(a.shape() == b.shape());
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    sum += std::abs(static_cast<double>(a.data()[i]) - static_cast<double>(b.data()[i]));
  }
  return sum / static_cast<double>(a.size());
}

}  // namespace

TEST_CASE("decode_image matches PIL for every file and channel count") {
  const auto& cases = manifest()["decode"];
  REQUIRE(cases.size() > 30);
  for (const auto& c : cases) {
    const std::string file = c["file"];
    const int channels = c["channels"];
    CAPTURE(file);
    CAPTURE(channels);
    const auto bytes = read_bytes(images_dir() / file);
    const auto decoded = image::decode_image(bytes, channels, file);
    const auto reference =
        read_npy<std::int32_t>(images_dir() / "reference" / c["reference"].get<std::string>());
    CHECK(max_abs_diff(decoded, reference) <= c["tolerance"].get<double>());
  }
}

TEST_CASE("the JPEGs of a TensorFlow-written TFRecord file decode as PIL decodes them") {
  // tests/data/files/tensorflow/images.tfrecord: tf.train.Examples written by TensorFlow's
  // TFRecordWriter; expected.json holds PIL's decoding (describe.py).
  const auto dir = images_dir().parent_path() / "files" / "tensorflow";
  std::ifstream in(dir / "expected.json");
  REQUIRE(in.good());
  const auto expected = nlohmann::json::parse(in)["images.tfrecord"];
  const FeatureSpecs features = {{"depth", FixedLenFeature{{}, ExampleDtype::int64}},
                                 {"image_raw", FixedLenFeature{{}, ExampleDtype::string}}};
  TFRecordDataset records({(dir / "images.tfrecord").string()});
  std::size_t i = 0;
  while (auto record = records.next()) {
    CAPTURE(i);
    REQUIRE(i < expected.size());
    const auto& e = expected[i++];
    auto parsed = parse_single_example(*record, features);
    const auto& jpeg = std::get<BytesTensor>(parsed["image_raw"].values).values.at(0);
    const auto pixels = image::decode_image(
        {reinterpret_cast<const std::uint8_t*>(jpeg.data()), jpeg.size()}, 0, "image_raw");
    auto shape = e["pil_shape"].get<std::vector<std::size_t>>();
    if (shape.size() == 2) shape.push_back(1);  // PIL's mode L is (h, w)
    CHECK(pixels.shape() == Shape(shape));
    CHECK(static_cast<std::int64_t>(pixels.shape()[2]) ==
          std::get<Tensor<std::int64_t>>(parsed["depth"].values).data()[0]);
    CHECK(crc32(0L, reinterpret_cast<const Bytef*>(pixels.data()),
                static_cast<uInt>(pixels.size())) == e["pil_crc32"].get<uLong>());
  }
  CHECK(i == expected.size());
}

TEST_CASE("decode_jpeg and decode_png give the stored channels with channels 0") {
  const auto jpeg = read_bytes(images_dir() / "rgb.jpg");
  CHECK(image::decode_jpeg(jpeg, 0, "rgb.jpg").shape() == Shape{37, 53, 3});
  CHECK(image::decode_jpeg(read_bytes(images_dir() / "gray.jpg")).shape() == Shape{29, 41, 1});
  CHECK(image::decode_png(read_bytes(images_dir() / "gray_alpha.png")).shape() == Shape{19, 17, 2});
  CHECK(image::decode_png(read_bytes(images_dir() / "palette_trns.png")).shape() ==
        Shape{21, 27, 4});
  CHECK(image::decode_png(read_bytes(images_dir() / "palette.png")).shape() == Shape{21, 27, 3});
  CHECK(image::sniff_format(jpeg) == image::ImageFormat::jpeg);
}

TEST_CASE("a CMYK JPEG decodes to RGB as TensorFlow decodes it, whole or a window of it") {
  // The reference (manifest "decode") checks the pixels; here the shapes, the window and the one
  // channel count TensorFlow refuses.
  const auto bytes = read_bytes(images_dir() / "cmyk.jpg");
  const auto full = image::decode_jpeg(bytes, 0, "cmyk.jpg");
  CHECK(full.shape() == Shape{21, 27, 3});
  CHECK(image::decode_image(bytes, 3, "cmyk.jpg") == full);
  CHECK(image::decode_jpeg_window(bytes, {3, 5, 12, 17}, 3, "cmyk.jpg", 8) ==
        image::crop_to_bounding_box(full, 3, 5, 12, 17));
  CHECK_THROWS_WITH_AS(image::decode_jpeg(bytes, 1, "cmyk.jpg"),
                       "cmyk.jpg: a CMYK JPEG image decodes to RGB (channels 0 or 3), as "
                       "TensorFlow decodes it, but channels is 1",
                       FormatError);
}

TEST_CASE("decode_gif gives every frame of an animation as TensorFlow composes them") {
  const auto animated = read_bytes(images_dir() / "animated.gif");
  const auto frames = image::decode_gif(animated, "animated.gif");
  CHECK(frames.shape() == Shape{3, 17, 21, 3});
  const auto reference =
      read_npy<std::int32_t>(images_dir() / "reference" / "animated_gif_frames.npy");
  CHECK(max_abs_diff(frames, reference) == 0.0);
  // The first frame is decode_image's; a single-frame file gives one frame.
  CHECK(image::decode_image(animated, 3, "animated.gif") ==
        frames.slice_rows(0, 1).reshape(Shape{17, 21, 3}));
  CHECK(image::decode_gif(read_bytes(images_dir() / "plain.gif"), "plain.gif").shape() ==
        Shape{1, 19, 23, 3});
  // decode_image with expand_animations: every frame of a GIF, one image of the other formats.
  CHECK(image::decode_image(animated, 0, "animated.gif", true) == frames);
  CHECK(image::decode_image(read_bytes(images_dir() / "plain.gif"), 3, "plain.gif", true).shape() ==
        Shape{1, 19, 23, 3});
  CHECK(image::decode_image(read_bytes(images_dir() / "rgb24.bmp"), 0, "rgb24.bmp", true) ==
        image::decode_image(read_bytes(images_dir() / "rgb24.bmp"), 0, "rgb24.bmp"));
  CHECK_THROWS_WITH_AS(image::decode_image(animated, 1, "animated.gif", true),
                       "animated.gif: channels must be 0 or 3 for a GIF image but is 1",
                       ConfigError);
  // A later frame cut short: decode_gif refuses it, decode_image keeps the first frame.
  const std::vector<std::uint8_t> tail_cut(animated.begin(), animated.end() - 40);
  CHECK_THROWS_WITH_AS(image::decode_gif(tail_cut, "tail.gif"),
                       contains("tail.gif: invalid GIF data: cannot decode frame 2: "),
                       FormatError);
}

TEST_CASE("decode_png16 gives the 16-bit samples; 8-bit images are widened by 257") {
  const auto ref_dir = images_dir() / "reference";
  CHECK(image::decode_png16(read_bytes(images_dir() / "gray16.png")) ==
        read_npy<std::int32_t>(ref_dir / "gray16_16bit.npy"));
  CHECK(image::decode_png16(read_bytes(images_dir() / "rgb16.png")) ==
        read_npy<std::int32_t>(ref_dir / "rgb16_16bit.npy"));
  const auto eight = image::decode_png(read_bytes(images_dir() / "rgb.png"));
  const auto sixteen = image::decode_png16(read_bytes(images_dir() / "rgb.png"));
  REQUIRE(sixteen.shape() == eight.shape());
  for (std::size_t i = 0; i < eight.size(); ++i)
    REQUIRE(sixteen.data()[i] == eight.data()[i] * 257);
}

TEST_CASE("corrupt, truncated and unsupported data throw FormatError naming the source") {
  const auto jpeg = read_bytes(images_dir() / "rgb.jpg");
  const auto png = read_bytes(images_dir() / "rgb.png");
  SUBCASE("a truncated JPEG") {
    const std::vector<std::uint8_t> cut(jpeg.begin(), jpeg.begin() + jpeg.size() / 2);
    CHECK_THROWS_WITH_AS(image::decode_image(cut, 3, "cut.jpg"),
                         contains("cut.jpg: invalid JPEG data: cannot decode the image data: "),
                         FormatError);
  }
  SUBCASE("a JPEG cut inside its header") {
    const std::vector<std::uint8_t> cut(jpeg.begin(), jpeg.begin() + 20);
    CHECK_THROWS_WITH_AS(image::decode_jpeg(cut, 0, "head.jpg"),
                         contains("head.jpg: invalid JPEG data: cannot read the header: "),
                         FormatError);
  }
  SUBCASE("a truncated PNG") {
    const std::vector<std::uint8_t> cut(png.begin(), png.begin() + png.size() - 40);
    CHECK_THROWS_WITH_AS(image::decode_image(cut, 0, "cut.png"),
                         contains("cut.png: invalid PNG data: cannot decode the image data: "),
                         FormatError);
  }
  SUBCASE("a PNG with a damaged header CRC") {
    auto bad = png;
    bad[20] ^= 0xff;  // inside IHDR's data
    CHECK_THROWS_WITH_AS(image::decode_png(bad, 0, "crc.png"),
                         "crc.png: invalid PNG data: cannot read the header: IHDR: CRC error",
                         FormatError);
  }
  SUBCASE("a file that cannot be read") {
    CHECK_THROWS_WITH_AS(image::read_file("/nonexistent/x.jpg"), "cannot open '/nonexistent/x.jpg'",
                         IoError);
    CHECK(image::read_file(images_dir() / "rgb.jpg") == jpeg);
  }
  SUBCASE("no bytes, unknown bytes, bad GIF and BMP data") {
    CHECK_THROWS_WITH_AS(image::decode_image({}, 0, "empty"),
                         "empty: unknown image format (expected the signature of a JPEG, a PNG "
                         "or a BMP, found none in 0 bytes)",
                         FormatError);
    const std::vector<std::uint8_t> gif = {'G', 'I', 'F', '8', '9', 'a'};
    CHECK_THROWS_WITH_AS(image::decode_image(gif, 0, "a.gif"),
                         contains("a.gif: invalid GIF data: cannot read the header: "),
                         FormatError);
    // A screen without an image, and a 1x1 image without a colour map (neither global nor local).
    const std::vector<std::uint8_t> empty_gif = {'G', 'I', 'F', '8', '9', 'a', 1,
                                                 0,   1,   0,   0,   0,   0,   0x3b};
    CHECK_THROWS_WITH_AS(image::decode_image(empty_gif, 0, "empty.gif"),
                         "empty.gif: invalid GIF data: the file holds no image", FormatError);
    const std::vector<std::uint8_t> colourless = {'G', 'I', 'F', '8',  '9', 'a',  1, 0, 1,   0,
                                                  0,   0,   0,   0x2c, 0,   0,    0, 0, 1,   0,
                                                  1,   0,   0,   2,    2,   0x44, 1, 0, 0x3b};
    CHECK_THROWS_WITH_AS(image::decode_gif(colourless, "colourless.gif"),
                         "colourless.gif: invalid GIF data: frame 0 has no colour map",
                         FormatError);
    const auto plain = read_bytes(images_dir() / "plain.gif");
    CHECK_THROWS_WITH_AS(image::decode_image(plain, 1, "plain.gif"),
                         "plain.gif: channels must be 0 or 3 for a GIF image but is 1",
                         ConfigError);
    // Cut inside the first frame's data: an error; inside a later frame's: the first frame.
    const std::vector<std::uint8_t> cut(
        plain.begin(), plain.begin() + static_cast<std::ptrdiff_t>(plain.size() / 2));
    CHECK_THROWS_WITH_AS(image::decode_image(cut, 0, "cut.gif"),
                         contains("cut.gif: invalid GIF data: cannot decode frame 0: "),
                         FormatError);
    const auto animated = read_bytes(images_dir() / "animated.gif");
    const std::vector<std::uint8_t> tail_cut(animated.begin(), animated.end() - 40);
    CHECK(image::decode_image(tail_cut, 0, "tail.gif") == image::decode_image(animated, 3));
    const std::vector<std::uint8_t> bmp = {'B', 'M', 0, 0};
    CHECK_THROWS_WITH_AS(image::decode_image(bmp, 0, "a.bmp"),
                         "a.bmp: invalid BMP data: expected a header of at least 34 bytes "
                         "starting with 'BM' but found 4 bytes",
                         FormatError);
    auto rgb = read_bytes(images_dir() / "rgb24.bmp");
    CHECK_THROWS_WITH_AS(image::decode_image(rgb, 1, "rgb24.bmp"),
                         "rgb24.bmp: channels must be 0, 3 or 4 for a BMP image but is 1",
                         ConfigError);
    const auto truncated = std::vector<std::uint8_t>(rgb.begin(), rgb.end() - 1);
    CHECK_THROWS_WITH_AS(
        image::decode_bmp(truncated, 0, "cut.bmp"),
        contains("cut.bmp: invalid BMP data: expected " + std::to_string(rgb.size()) + " bytes"),
        FormatError);
    auto rle = rgb;
    rle[30] = 1;  // BI_RLE8
    CHECK_THROWS_WITH_AS(image::decode_bmp(rle, 0, "rle.bmp"),
                         "rle.bmp: compressed BMP data (compression 1) is not supported "
                         "(uncompressed rows are)",
                         FormatError);
    auto narrow = rgb;
    std::fill_n(narrow.begin() + 18, 4, std::uint8_t{0});  // width 0
    CHECK_THROWS_WITH_AS(image::decode_bmp(narrow, 0, "narrow.bmp"),
                         "narrow.bmp: invalid BMP data: expected a positive width, a nonzero "
                         "height and a nonnegative offset but found 0, 11 and 54",
                         FormatError);
    auto deep = rgb;
    deep[28] = 16;
    CHECK_THROWS_WITH_AS(image::decode_bmp(deep, 0, "deep.bmp"),
                         "deep.bmp: invalid BMP data: expected 8, 24 or 32 bits per pixel but "
                         "found 16",
                         FormatError);
  }
  SUBCASE("channel counts tf refuses") {
    CHECK_THROWS_WITH_AS(image::decode_image(jpeg, 4, "rgb.jpg"),
                         "rgb.jpg: a JPEG image cannot be decoded with 4 channels (0, 1 or 3)",
                         FormatError);
    CHECK_THROWS_WITH_AS(image::decode_jpeg(jpeg, 4, "rgb.jpg"),
                         "rgb.jpg: channels must be 0, 1 or 3 for a JPEG image but is 4",
                         ConfigError);
    CHECK_THROWS_WITH_AS(image::decode_png(png, 2, "rgb.png"),
                         "rgb.png: channels must be 0, 1, 3 or 4 but is 2", ConfigError);
  }
  SUBCASE("a header claiming more pixels than the limit") {
    auto huge = png;
    // IHDR's width and height (bytes 16..23) set to 60000 x 60000, CRC fixed by libpng's
    // check happening after the size check: damage only the size, expect the CRC message or
    // the size refusal, whichever comes first, both as FormatError.
    huge[16] = 0;
    huge[17] = 0;
    huge[18] = 0xea;
    huge[19] = 0x60;
    huge[20] = 0;
    huge[21] = 0;
    huge[22] = 0xea;
    huge[23] = 0x60;
    CHECK_THROWS_AS(image::decode_png(huge, 0, "huge.png"), FormatError);
  }
}

TEST_CASE("resize's bicubic is tf's ResizeBicubic (generate_bicubic.py, checked against PIL)") {
  const auto source = image::decode_png(read_bytes(images_dir() / "rgb.png"));
  nlohmann::json bicubic;
  std::ifstream(images_dir() / "reference" / "bicubic.json") >> bicubic;
  REQUIRE(bicubic["cases"].size() == 6);
  for (const auto& c : bicubic["cases"]) {
    CAPTURE(c["height"].get<int>());
    CAPTURE(c["width"].get<int>());
    const auto reference =
        read_npy<float>(images_dir() / "reference" / c["reference"].get<std::string>());
    const auto out = image::resize(source, c["height"], c["width"], image::ResizeMethod::bicubic);
    CHECK(out.shape() == reference.shape());
    CHECK(max_abs_diff(out, reference) < 2e-3);
  }
  // Keys' cubic overshoots at edges: values leave [0, 255] as tf's do (no clamping).
  Tensor<float> step(Shape{1, 4, 1});
  step.data()[2] = step.data()[3] = 255.0f;
  const auto up = image::resize(step, 1, 16, image::resize_method("bicubic"));
  CHECK(*std::min_element(up.begin(), up.end()) < 0.0f);
  CHECK(*std::max_element(up.begin(), up.end()) > 255.0f);
}

TEST_CASE("resize matches PyTorch (bilinear, nearest-exact) and tf's area formula") {
  const auto source = image::decode_png(read_bytes(images_dir() / "rgb.png"));
  const auto source_float = source.cast<float>();
  const auto& cases = manifest()["resize"];
  REQUIRE(cases.size() == 12);
  for (const auto& c : cases) {
    const std::string method = c["method"];
    CAPTURE(method);
    CAPTURE(c["height"].get<int>());
    CAPTURE(c["width"].get<int>());
    const auto reference =
        read_npy<float>(images_dir() / "reference" / c["reference"].get<std::string>());
    const auto out = image::resize(source, c["height"], c["width"], image::resize_method(method));
    CHECK(max_abs_diff(out, reference) < 2e-3);
    CHECK(max_abs_diff(
              image::resize(source_float, c["height"], c["width"], image::resize_method(method)),
              reference) < 2e-3);
  }
  CHECK_THROWS_WITH_AS(image::resize_method("mitchellcubic"),
                       "resize: interpolation 'mitchellcubic' is not implemented (bilinear, "
                       "nearest, area and bicubic are)",
                       ConfigError);
  CHECK_THROWS_WITH_AS(image::resize(source, 0, 4),
                       "resize: the target size must be positive "
                       "but is 0x4",
                       ShapeError);
  CHECK_THROWS_WITH_AS(image::resize(Tensor<float>(Shape{4, 4}), 2, 2),
                       "resize: expected a non-empty image of shape (height, width, channels) but "
                       "got a float32 tensor of shape (4, 4)",
                       ShapeError);
}

TEST_CASE("crops, flips, brightness and contrast follow tf.image's formulas") {
  Tensor<float> image(Shape{4, 5, 2});
  for (std::size_t i = 0; i < image.size(); ++i)
    image.data()[i] = static_cast<float>(i);
  SUBCASE("central_crop: start int((size - size * fraction) / 2)") {
    const auto c = image::central_crop(image, 0.5);
    REQUIRE(c.shape() == Shape{2, 3, 2});  // rows start 1, columns start int(1.25) = 1
    CHECK(c(0, 0, 0) == image(1, 1, 0));
    CHECK(c(1, 2, 1) == image(2, 3, 1));
    CHECK_THROWS_WITH_AS(image::central_crop(image, 0.0),
                         "central_crop: central_fraction must be in (0, 1] but is 0.000000",
                         ConfigError);
  }
  SUBCASE("flips") {
    const auto lr = image::flip_left_right(image);
    const auto ud = image::flip_up_down(image);
    CHECK(lr(1, 0, 1) == image(1, 4, 1));
    CHECK(ud(0, 2, 0) == image(3, 2, 0));
    CHECK(image::flip_left_right(lr) == image);
    std::set<bool> flipped;
    for (std::uint64_t seed = 0; seed < 64; ++seed) {
      const auto r = image::random_flip_left_right(image, seed);
      CHECK(r == image::random_flip_left_right(image, seed));
      flipped.insert(r == lr);
    }
    CHECK(flipped.size() == 2);
  }
  SUBCASE("random_crop: a window of the image, the same for the same seed") {
    std::set<std::pair<float, float>> corners;
    for (std::uint64_t seed = 0; seed < 50; ++seed) {
      const auto c = image::random_crop(image, 2, 3, seed);
      REQUIRE(c.shape() == Shape{2, 3, 2});
      CHECK(c == image::random_crop(image, 2, 3, seed));
      const auto first = static_cast<std::size_t>(c(0, 0, 0)) / 2;
      const std::size_t top = first / 5, left = first % 5;
      CHECK(c == image::crop_to_bounding_box(image, top, left, 2, 3));
      corners.insert({static_cast<float>(top), static_cast<float>(left)});
    }
    CHECK(corners.size() == 9);  // every offset of (4 - 2 + 1) x (5 - 3 + 1)
    CHECK_THROWS_WITH_AS(image::random_crop(image, 5, 1, 0),
                         "random_crop: size 5x1 is empty or larger than the image's 4x5",
                         ShapeError);
  }
  SUBCASE("adjust_contrast: (x - channel mean) * factor + channel mean") {
    const auto out = image::adjust_contrast(image, 2.0f);
    // Channel 0 holds 0, 2, ..., 38 (mean 19); channel 1 holds 1, 3, ..., 39 (mean 20).
    CHECK(out(0, 0, 0) == doctest::Approx(-19.0));
    CHECK(out(3, 4, 1) == doctest::Approx(58.0));
    CHECK(image::adjust_brightness(image, 0.5f)(2, 2, 1) == doctest::Approx(image(2, 2, 1) + 0.5));
    const auto r = image::random_contrast(image, 0.5f, 1.5f, 9);
    CHECK(r == image::random_contrast(image, 0.5f, 1.5f, 9));
    CHECK_THROWS_WITH_AS(image::random_contrast(image, 1.5f, 0.5f, 9),
                         "random_contrast: expected 0 <= lower < upper but lower is 1.500000 and "
                         "upper 0.500000",
                         ConfigError);
  }
  SUBCASE("smart_resize and resize_with_pad keep the aspect ratio") {
    Tensor<float> wide(Shape{10, 40, 1}, 7.0f);
    const auto cropped = image::smart_resize(wide, 8, 8);
    CHECK(cropped.shape() == Shape{8, 8, 1});
    CHECK(cropped(4, 4, 0) == doctest::Approx(7.0));
    const auto padded = image::resize_with_pad(wide, 8, 8);
    REQUIRE(padded.shape() == Shape{8, 8, 1});
    // 40x10 scaled by 5 to 8x2, placed at row floor((8 - 2) / 2) = 3.
    CHECK(padded(2, 0, 0) == 0.0f);
    CHECK(padded(3, 0, 0) == doctest::Approx(7.0));
    CHECK(padded(4, 7, 0) == doctest::Approx(7.0));
    CHECK(padded(5, 0, 0) == 0.0f);
  }
}

TEST_CASE("random_resized_crop_window draws torchvision's windows") {
  std::set<std::size_t> heights;
  for (std::uint64_t seed = 0; seed < 500; ++seed) {
    const auto w = image::random_resized_crop_window(375, 500, seed);
    REQUIRE(w.height > 0);
    REQUIRE(w.top + w.height <= 375);
    REQUIRE(w.left + w.width <= 500);
    const double area = static_cast<double>(w.height * w.width) / (375.0 * 500.0);
    const double ratio = static_cast<double>(w.width) / static_cast<double>(w.height);
    CHECK(area >= 0.07);
    CHECK(ratio >= 0.74);
    CHECK(ratio <= 1.34);
    CHECK(w == image::random_resized_crop_window(375, 500, seed));
    heights.insert(w.height);
  }
  CHECK(heights.size() > 100);
  // Nothing fits a scale of at least 2x the image: the fallback is the central crop at the
  // nearest allowed ratio (a 100x10 image is narrower than 3/4: height round(10 / 0.75) = 13).
  const auto fallback = image::random_resized_crop_window(100, 10, 1, {.scale = {2.0, 3.0}});
  CHECK(fallback == image::CropWindow{43, 0, 13, 10});
  CHECK_THROWS_WITH_AS(image::random_resized_crop_window(10, 10, 1, {.scale = {0.5, 0.1}}),
                       contains("random_resized_crop: scale and ratio must be positive ranges"),
                       ConfigError);
}

TEST_CASE("decode_jpeg_window decodes only the window, at a reduced scale where asked") {
  const auto bytes = read_bytes(images_dir() / "large.jpg");
  const auto full = image::decode_jpeg(bytes, 3, "large.jpg");
  const image::CropWindow window{21, 37, 50, 61};
  const auto cropped = image::crop_to_bounding_box(full, 21, 37, 50, 61);
  // At full scale the pixels are the full decode's (a column of context on each side).
  CHECK(image::decode_jpeg_window(bytes, window, 3, "large.jpg", 8) == cropped);
  CHECK(image::decode_jpeg_window(bytes, {0, 0, 96, 128}, 3, "large.jpg", 8) == full);
  // At scale 1/2, the window of the 48x64 image rounded outwards (rows 10..36, columns 18..49):
  // close to the full decode's rows 20..72 and columns 36..98 averaged 2x2.
  const auto half = image::decode_jpeg_window(bytes, window, 3, "large.jpg", 4);
  REQUIRE(half.shape() == Shape{26, 31, 3});
  const auto reference = image::resize(image::crop_to_bounding_box(full, 20, 36, 52, 62), 26, 31,
                                       image::ResizeMethod::area);
  const double near = mean_abs_diff(half, reference);
  const double far =
      mean_abs_diff(half, image::resize(image::crop_to_bounding_box(full, 0, 0, 50, 61), 26, 31,
                                        image::ResizeMethod::area));
  CHECK(near < 6.0);
  CHECK(far > 2 * near);
  CHECK_THROWS_WITH_AS(image::decode_jpeg_window(bytes, {90, 0, 10, 10}, 3, "large.jpg"),
                       "large.jpg: crop window of 10x10 at (90, 0) is empty or outside the 96x128 "
                       "image",
                       ShapeError);
  SUBCASE("decode_random_resized_crop: the crop of the full decode at full scale") {
    std::size_t reduced = 0;
    double worst = 0;
    for (std::uint64_t seed = 0; seed < 40; ++seed) {
      const auto fast = image::decode_random_resized_crop(bytes, 24, 24, seed, 3, "large.jpg");
      const auto slow = image::random_resized_crop(full, 24, 24, seed);
      REQUIRE(fast.shape() == Shape{24, 24, 3});
      const auto window = image::random_resized_crop_window(96, 128, seed);
      if (image::jpeg_scale_for(window, 24, 24) == 8) {
        CHECK(fast == slow);
      } else {
        // A reduced scale averages where bilinear without antialiasing samples: compare with
        // the area resize of the same window.
        ++reduced;
        const auto area = image::resize(
            image::crop_to_bounding_box(full, window.top, window.left, window.height, window.width),
            24, 24, image::ResizeMethod::area);
        CHECK(mean_abs_diff(fast, area) < 6.0);
        worst = std::max(worst, mean_abs_diff(fast, area));
      }
    }
    CHECK(reduced > 10);
    MESSAGE("worst mean difference at a reduced scale: " << worst);
  }
}

TEST_CASE("NumpyRandomState shuffles as np.random.RandomState(seed).shuffle") {
  const auto& orders = manifest()["numpy_shuffle"];
  REQUIRE(orders.size() == 42);
  for (const auto& c : orders) {
    const std::uint64_t seed = c["seed"];
    const std::size_t n = c["n"];
    CAPTURE(seed);
    CAPTURE(n);
    std::vector<std::int64_t> items(n);
    for (std::size_t i = 0; i < n; ++i)
      items[i] = static_cast<std::int64_t>(i);
    NumpyRandomState(seed).shuffle(items);
    CHECK(items == c["order"].get<std::vector<std::int64_t>>());
  }
  CHECK_THROWS_WITH_AS(NumpyRandomState(std::uint64_t{1} << 32),
                       "NumpyRandomState: seed must be between 0 and 2**32 - 1 but is 4294967296",
                       ConfigError);
}

TEST_CASE("image_dataset_from_directory lists, shuffles and splits the files as Keras") {
  const std::string root = (images_dir() / "folder").string();
  for (const auto& c : manifest()["folder"]) {
    const double split = c["validation_split"];
    const std::uint64_t seed = c["seed"];
    CAPTURE(seed);
    auto expected = [&](const char* key) {
      std::vector<std::string> paths;
      for (const auto& p : c[key])
        paths.push_back((std::filesystem::path(root) / p.get<std::string>()).string());
      return paths;
    };
    ImageDatasetOptions options{.batch_size = 4,
                                .image_size = {8, 8},
                                .shuffle = c["shuffle"],
                                .seed = seed,
                                .verbose = false};
    if (split == 0) {
      auto ds = image_dataset_from_directory(root, options);
      CHECK(ds.file_paths() == expected("paths"));
      CHECK(ds.labels() == c["labels"].get<std::vector<std::int64_t>>());
      CHECK(ds.class_names() == c["class_names"].get<std::vector<std::string>>());
    } else {
      options.validation_split = split;
      options.subset = "training";
      CHECK(image_dataset_from_directory(root, options).file_paths() == expected("training"));
      options.subset = "validation";
      CHECK(image_dataset_from_directory(root, options).file_paths() == expected("validation"));
      options.subset = "both";
      auto [train, validation] = image_dataset_from_directory_both(root, options);
      CHECK(train.file_paths() == expected("training"));
      CHECK(validation.file_paths() == expected("validation"));
    }
  }
}

TEST_CASE("image_dataset_from_directory yields Keras's batches and labels") {
  const std::string root = (images_dir() / "folder").string();
  SUBCASE("int labels, unshuffled: the images of the files in order") {
    auto ds = image_dataset_from_directory(
        root, {.batch_size = 4, .image_size = {5, 7}, .shuffle = false, .verbose = false});
    const auto batches = test_support::drain(ds);
    REQUIRE(batches.size() == 4);  // 15 files
    CHECK(batches[0].first.shape() == Shape{4, 5, 7, 3});
    CHECK(batches[3].first.shape() == Shape{3, 5, 7, 3});
    CHECK(batches[0].second.shape() == Shape{4});
    // Each file is one flat colour: the first file's value, decoded, is every pixel's.
    const auto first = image::decode_image(read_bytes(ds.file_paths()[0]), 3);
    CHECK(batches[0].first(0, 2, 3, 1) == doctest::Approx(first(0, 0, 1)).epsilon(0.01));
    for (std::size_t b = 0, i = 0; b < batches.size(); ++b) {
      for (std::size_t k = 0; k < batches[b].second.size(); ++k, ++i) {
        CHECK(batches[b].second.data()[k] == static_cast<float>(ds.labels()[i]));
      }
    }
  }
  SUBCASE("categorical, grayscale, unbatched") {
    auto ds = image_dataset_from_directory(root, {.label_mode = "categorical",
                                                  .color_mode = "grayscale",
                                                  .batch_size = std::nullopt,
                                                  .image_size = {3, 3},
                                                  .seed = 5,
                                                  .verbose = false});
    const auto first = ds.next();
    REQUIRE(first);
    CHECK(first->first.shape() == Shape{3, 3, 1});
    CHECK(first->second.shape() == Shape{3});
  }
  SUBCASE("class_names picks and orders the classes") {
    auto ds =
        image_dataset_from_directory(root, {.label_mode = "binary",
                                            .class_names = std::vector<std::string>{"dogs", "cats"},
                                            .batch_size = 2,
                                            .image_size = {4, 4},
                                            .shuffle = false,
                                            .verbose = false});
    CHECK(ds.file_paths().size() == 9);
    CHECK(ds.labels().front() == 0);  // dogs first
    CHECK(ds.next()->second.shape() == Shape{2, 1});
  }
  SUBCASE("exact resume across epochs with a parallel map") {
    dataset_test::check_exact_resume(
        [&] {
          return image_dataset_from_directory(root, {.batch_size = 2,
                                                     .image_size = {4, 6},
                                                     .seed = 11,
                                                     .interpolation = "area",
                                                     .crop_to_aspect_ratio = true,
                                                     .verbose = false,
                                                     .num_parallel_calls = 2});
        },
        3, 6);
  }
  SUBCASE("shard splits the batches between ranks") {
    auto make = [&] {
      return image_dataset_from_directory(
          root, {.batch_size = 3, .image_size = {4, 4}, .seed = 3, .verbose = false});
    };
    auto all = make();
    const auto batches = test_support::drain(all);
    auto rank1 = make().shard(2, 1);
    const auto mine = test_support::drain(rank1);
    REQUIRE(mine.size() == 2);
    CHECK(mine[0] == batches[1]);
    CHECK(mine[1] == batches[3]);
  }
}

TEST_CASE("image_dataset_from_directory refuses what Keras refuses and what is not implemented") {
  const std::string root = (images_dir() / "folder").string();
  auto refuse = [&](ImageDatasetOptions options, const std::string& message) {
    options.verbose = false;
    CHECK_THROWS_WITH_AS(image_dataset_from_directory(root, options), message.c_str(), ConfigError);
  };
  refuse({.label_mode = "sparse"},
         "image_dataset_from_directory: label_mode must be 'int', "
         "'categorical', 'binary' or 'none' but is 'sparse'");
  refuse({.color_mode = "cmyk"},
         "image_dataset_from_directory: color_mode must be 'rgb', "
         "'rgba' or 'grayscale' but is 'cmyk'");
  refuse({.interpolation = "lanczos3"},
         "resize: interpolation 'lanczos3' is not implemented "
         "(bilinear, nearest, area and bicubic are)");
  refuse({.data_format = "channels_first"},
         "image_dataset_from_directory: data_format "
         "'channels_first' is not implemented (channels_last "
         "is)");
  refuse({.validation_split = 0.2, .subset = "training"},
         "image_dataset_from_directory: a seed is required with validation_split and shuffle, so "
         "that the training and validation subsets do not overlap");
  refuse({.validation_split = 0.2},
         "image_dataset_from_directory: if subset is set, validation_split must be set, and "
         "inversely (validation_split is 0.200000, subset is '')");
  refuse({.label_mode = "binary"},
         "image_dataset_from_directory: label_mode 'binary' needs "
         "exactly 2 classes but there are 3: ['birds', 'cats', 'dogs']");
  refuse({.class_names = std::vector<std::string>{"cats", "cows"}},
         "image_dataset_from_directory: class_names ['cats', 'cows'] do not match the "
         "sub-folders of '" +
             root + "': expected ['birds', 'cats', 'dogs'] (or a subset of it)");
  refuse({.labels = std::vector<std::int64_t>{0, 1}},
         "image_dataset_from_directory: expected the length of labels to match the number of "
         "files in the target directory: labels has 2 values while 16 files were found in '" +
             root + "'");
  refuse({.crop_to_aspect_ratio = true, .pad_to_aspect_ratio = true},
         "image_dataset_from_directory: only one of pad_to_aspect_ratio and crop_to_aspect_ratio "
         "can be true");
  CHECK_THROWS_WITH_AS(image_dataset_from_directory(root + "/missing", {.verbose = false}),
                       ("image_dataset_from_directory: directory '" + root +
                        "/missing' does not exist or is not a folder")
                           .c_str(),
                       IoError);
  auto ds = image_dataset_from_directory(root, {.seed = 1, .verbose = false});
  auto other = image_dataset_from_directory(root, {.seed = 2, .verbose = false});
  CHECK_THROWS_WITH_AS(other.restore(ds.state()),
                       "image_dataset_from_directory: state is of 15 files with seed 1 but this "
                       "dataset has 15 files with seed 2",
                       CheckpointError);
}

namespace {

// a/ holds 5 texts, b/ 4 (one in a nested folder), with a non-.txt file and a hidden folder.
void write_text_tree(const std::filesystem::path& root) {
  auto write = [&](const std::string& name, const std::string& text) {
    std::filesystem::create_directories((root / name).parent_path());
    std::ofstream(root / name, std::ios::binary) << text;
  };
  for (int i = 0; i < 5; ++i)
    write("a/a" + std::to_string(i) + ".txt", "alpha text number " + std::to_string(i));
  for (int i = 0; i < 3; ++i)
    write("b/b" + std::to_string(i) + ".TXT", "beta " + std::to_string(i));
  write("b/deep/b9.txt", "beta deep");
  write("b/skip.md", "not listed");
  write(".hidden/h.txt", "hidden class");
}

}  // namespace

TEST_CASE("text_dataset_from_directory reads the texts in Keras's order") {
  test_support::TempDir dir;
  write_text_tree(dir.path());
  const std::string root = dir.path().string();
  SUBCASE("unshuffled: sorted classes, files sorted by folder then name, max_length in bytes") {
    auto ds = text_dataset_from_directory(
        root, {.batch_size = 4, .max_length = 7, .shuffle = false, .verbose = false});
    CHECK(ds.class_names() == std::vector<std::string>{"a", "b"});
    REQUIRE(ds.file_paths().size() == 9);
    CHECK(ds.file_paths()[5] == (dir.path() / "b" / "b0.TXT").string());
    CHECK(ds.file_paths()[8] == (dir.path() / "b" / "deep" / "b9.txt").string());
    const auto batches = test_support::drain(ds);
    REQUIRE(batches.size() == 3);
    CHECK(batches[0].first == std::vector<std::string>{"alpha t", "alpha t", "alpha t", "alpha t"});
    CHECK(batches[2].first == std::vector<std::string>{"beta de"});
    CHECK(batches[1].second == Tensor<float>(Shape{4}, {0, 1, 1, 1}));
  }
  SUBCASE("shuffled: the sorted list shuffled by NumPy's RandomState, and exact resume") {
    auto sorted = text_dataset_from_directory(root, {.shuffle = false, .verbose = false});
    auto expected = sorted.file_paths();
    NumpyRandomState(77).shuffle(expected);
    auto ds = text_dataset_from_directory(
        root, {.label_mode = "categorical", .batch_size = 2, .seed = 77, .verbose = false});
    CHECK(ds.file_paths() == expected);
    CHECK(ds.next()->second.shape() == Shape{2, 2});
    dataset_test::check_exact_resume(
        [&] {
          return text_dataset_from_directory(root, {.batch_size = 2,
                                                    .seed = 77,
                                                    .validation_split = 0.3,
                                                    .subset = "training",
                                                    .verbose = false});
        },
        3, 5);
    auto validation = text_dataset_from_directory(
        root, {.seed = 77, .validation_split = 0.3, .subset = "validation", .verbose = false});
    CHECK(validation.file_paths() ==
          std::vector<std::string>(expected.end() - 2, expected.end()));  // int(0.3 * 9) = 2
  }
  SUBCASE("refusals") {
    CHECK_THROWS_WITH_AS(
        text_dataset_from_directory(
            root, {.seed = 1, .validation_split = 0.5, .subset = "both", .verbose = false}),
        "text_dataset_from_directory: subset 'both' is not implemented (build the 'training' and "
        "the 'validation' subsets with the same seed)",
        ConfigError);
    CHECK_THROWS_WITH_AS(
        text_dataset_from_directory(
            root,
            {.labels = nullptr, .class_names = std::vector<std::string>{"a"}, .verbose = false}),
        "text_dataset_from_directory: class_names cannot be given with labels=None (no labels)",
        ConfigError);
  }
}

TEST_CASE("the README's pipeline: unbatched images, seeded augmentation, batches") {
  const std::string root = (images_dir() / "folder").string();
  auto make = [&] {
    auto train = image_dataset_from_directory(root, {.batch_size = std::nullopt,
                                                     .image_size = {12, 12},
                                                     .seed = 123,
                                                     .validation_split = 0.2,
                                                     .subset = "training",
                                                     .verbose = false,
                                                     .num_parallel_calls = 2});
    return std::move(train)
        .map_with_seed(
            [](Tensor<float> image, Tensor<float> label, std::uint64_t seed) {
              image =
                  image::random_flip_left_right(image::random_crop(image, 10, 10, seed), seed + 1);
              return std::pair{image::random_brightness(image, 20.0f, seed + 2), label};
            },
            7)
        .batch(5);
  };
  auto ds = make();
  const auto batches = test_support::drain(ds);
  REQUIRE(batches.size() == 3);  // 15 - int(0.2 * 15) = 12 files
  CHECK(batches[0].first.shape() == Shape{5, 10, 10, 3});
  CHECK(batches[2].second.shape() == Shape{2});
  dataset_test::check_exact_resume(make, 2, 4);
}

TEST_CASE("EXIF orientation: ignored by decode_image, applied on request as PIL's exif_transpose") {
  const auto& cases = manifest()["exif"];
  REQUIRE(cases.size() == 8);
  for (const auto& c : cases) {
    const std::string file = c["file"];
    CAPTURE(file);
    const auto bytes = read_bytes(images_dir() / file);
    const auto stored = image::decode_image(bytes, 3, file);
    CHECK(stored.shape() == Shape{9, 14, 3});
    CHECK(image::exif_orientation(bytes) == c["orientation"].get<int>());
    const auto upright = image::apply_exif_orientation(stored, image::exif_orientation(bytes));
    const auto reference =
        read_npy<std::int32_t>(images_dir() / "reference" / c["reference"].get<std::string>());
    CHECK(max_abs_diff(upright, reference) == 0);
  }
  CHECK(image::exif_orientation(read_bytes(images_dir() / "rgb.jpg")) == 1);
  CHECK(image::exif_orientation(read_bytes(images_dir() / "rgb.png")) == 1);
  CHECK_THROWS_WITH_AS(image::apply_exif_orientation(Tensor<float>(Shape{2, 2, 1}), 9),
                       "apply_exif_orientation: orientation must be 1 to 8 but is 9", ConfigError);
}

TEST_CASE("timeseries_dataset_from_array: Keras's start positions and windows") {
  for (const auto& c : manifest()["timeseries"]) {
    const std::size_t steps = c["steps"];
    CAPTURE(steps);
    Tensor<float> data(Shape{steps, 2});
    for (std::size_t i = 0; i < data.size(); ++i)
      data.data()[i] = static_cast<float>(i);
    std::optional<Tensor<float>> targets;
    if (!c["targets"].is_null()) {
      targets = Tensor<float>(Shape{c["targets"].get<std::size_t>()});
      for (std::size_t i = 0; i < targets->size(); ++i)
        targets->data()[i] = static_cast<float>(10 * i);
    }
    TimeseriesDatasetOptions options{.sequence_stride = c["sequence_stride"],
                                     .sampling_rate = c["sampling_rate"],
                                     .batch_size = 4,
                                     .shuffle = true,
                                     .seed = c["seed"].get<std::uint64_t>()};
    if (c["start_index"].get<int>() != 0) options.start_index = c["start_index"];
    if (!c["end_index"].is_null()) options.end_index = c["end_index"];
    const std::size_t length = c["sequence_length"];
    const std::size_t start = c["start_index"], rate = c["sampling_rate"];
    auto ds = timeseries_dataset_from_array(data, targets, length, options);
    const auto expected = c["positions"].get<std::vector<std::int64_t>>();
    CHECK(std::vector<std::int64_t>(ds.start_positions().begin(), ds.start_positions().end()) ==
          expected);
    // Every window holds steps start + p + k * rate; its target is step start + p.
    std::multiset<std::int64_t> seen;
    for (const auto& [sequences, batch_targets] : test_support::drain(ds)) {
      REQUIRE(sequences.shape()[1] == length);
      for (std::size_t b = 0; b < sequences.rows(); ++b) {
        const auto first = static_cast<std::size_t>(sequences(b, std::size_t{0}, std::size_t{0}));
        const std::size_t p = first / 2 - start;
        seen.insert(static_cast<std::int64_t>(p));
        for (std::size_t k = 0; k < length; ++k)
          REQUIRE(sequences(b, k, std::size_t{1}) ==
                  static_cast<float>((start + p + k * rate) * 2 + 1));
        if (targets) CHECK(batch_targets.data()[b] == static_cast<float>(10 * (start + p)));
      }
    }
    CHECK(seen == std::multiset<std::int64_t>(expected.begin(), expected.end()));
    dataset_test::check_exact_resume(
        [&] { return timeseries_dataset_from_array(data, targets, length, options); }, 2, 4);
  }
  Tensor<float> data(Shape{10, 1});
  CHECK_THROWS_WITH_AS(timeseries_dataset_from_array(data, std::nullopt, 3, {.end_index = 10}),
                       "timeseries_dataset_from_array: end_index must be lower than the length of "
                       "the data but is 10 for data of length 10",
                       ConfigError);
  CHECK_THROWS_WITH_AS(timeseries_dataset_from_array(data, std::nullopt, 11),
                       "timeseries_dataset_from_array: no complete sequence of length 11 with "
                       "sampling_rate 1 fits in steps [0, 10)",
                       ConfigError);
}

TEST_CASE("follow_links: a linked folder is listed only when asked, as os.walk(followlinks)") {
  test_support::TempDir dir;
  const auto png = read_bytes(images_dir() / "rgb.png");
  auto write = [&](const std::filesystem::path& path) {
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  };
  write(dir / "elsewhere/x.png");
  write(dir / "root/cats/a.png");
  write(dir / "root/dogs/b.png");
  std::filesystem::create_directory_symlink(dir / "elsewhere", dir / "root/cats/linked");
  const std::string root = (dir / "root").string();
  auto listed = [&](bool follow) {
    return image_dataset_from_directory(
               root, {.shuffle = false, .follow_links = follow, .verbose = false})
        .file_paths();
  };
  CHECK(listed(false) == std::vector<std::string>{root + "/cats/a.png", root + "/dogs/b.png"});
  CHECK(listed(true) == std::vector<std::string>{root + "/cats/a.png", root + "/cats/linked/x.png",
                                                 root + "/dogs/b.png"});
}

namespace {

// The per-pixel bilinear formula of tf's ResizeBilinear with half-pixel centres, written out
// directly: each output value reads its four neighbours and lerps along x, then along y, in
// float. `resize_box` computes it in two passes and must give the same bits.
template <class T>
Tensor<float> textbook_bilinear(const Tensor<T>& image, float top, float left, float box_height,
                                float box_width, std::size_t height, std::size_t width) {
  const std::size_t in_h = image.dim(0), in_w = image.dim(1), c = image.dim(2);
  auto tap = [](std::size_t i, std::size_t in_size, std::size_t out_size, float offset,
                float extent, std::size_t& lower, std::size_t& upper) {
    const float in =
        offset + (static_cast<float>(i) + 0.5f) * (extent / static_cast<float>(out_size)) - 0.5f;
    const auto last = static_cast<std::int64_t>(in_size) - 1;
    lower = static_cast<std::size_t>(
        std::clamp(static_cast<std::int64_t>(std::floor(in)), std::int64_t{0}, last));
    upper = static_cast<std::size_t>(
        std::clamp(static_cast<std::int64_t>(std::ceil(in)), std::int64_t{0}, last));
    return in - std::floor(in);
  };
  Tensor<float> out(Shape{height, width, c});
  for (std::size_t y = 0; y < height; ++y) {
    std::size_t y0 = 0, y1 = 0;
    const float wy = tap(y, in_h, height, top, box_height, y0, y1);
    for (std::size_t x = 0; x < width; ++x) {
      std::size_t x0 = 0, x1 = 0;
      const float wx = tap(x, in_w, width, left, box_width, x0, x1);
      for (std::size_t k = 0; k < c; ++k) {
        auto at = [&](std::size_t row, std::size_t column) {
          return static_cast<float>(image.data()[(row * in_w + column) * c + k]);
        };
        const float upper_value = at(y0, x0) + (at(y0, x1) - at(y0, x0)) * wx;
        const float lower_value = at(y1, x0) + (at(y1, x1) - at(y1, x0)) * wx;
        out.data()[(y * width + x) * c + k] = upper_value + (lower_value - upper_value) * wy;
      }
    }
  }
  return out;
}

// Whether two tensors hold the same bits (no NaNs here: equal values of equal sign), reporting
// the first index that differs.
bool same_bits(const Tensor<float>& out, const Tensor<float>& target) {
  REQUIRE(out.shape() == target.shape());
  for (std::size_t i = 0; i < out.size(); ++i) {
    const float value = out.data()[i], expected = target.data()[i];
    if (value != expected || std::signbit(value) != std::signbit(expected)) {
      MESSAGE("index " << i << ": " << value << " but the textbook formula gives " << expected
                       << " (a difference of " << value - expected << ")");
      return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("resize_box's bilinear gives the bits of the per-pixel textbook formula") {
  struct Size {
    std::size_t in_h, in_w, out_h, out_w;
  };
  // Up, down, mixed, odd, single rows, columns and pixels on either side, and the images
  // benchmark's sizes (a 375x500 JPEG, or a window of it at a reduced scale, to 224x224).
  const Size sizes[] = {{4, 5, 9, 11},  {17, 13, 5, 7}, {7, 23, 13, 3},       {1, 9, 4, 5},
                        {9, 1, 5, 4},   {1, 1, 3, 2},   {6, 8, 1, 1},         {5, 7, 5, 7},
                        {3, 31, 1, 30}, {29, 2, 30, 1}, {375, 500, 224, 224}, {100, 120, 224, 224}};
  SplitMix64 random(2024);
  for (const std::size_t channels :
       {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{4}, std::size_t{5}}) {
    CAPTURE(channels);
    for (const auto& s : sizes) {
      CAPTURE(s.in_h);
      CAPTURE(s.in_w);
      CAPTURE(s.out_h);
      CAPTURE(s.out_w);
      Tensor<std::uint8_t> bytes(Shape{s.in_h, s.in_w, channels});
      Tensor<float> floats(Shape{s.in_h, s.in_w, channels});
      for (std::size_t i = 0; i < bytes.size(); ++i) {
        bytes.data()[i] = static_cast<std::uint8_t>(random.below(256));
        floats.data()[i] = static_cast<float>(random.uniform() * 512.0 - 256.0);
      }
      const float h = static_cast<float>(s.in_h), w = static_cast<float>(s.in_w);
      CHECK(same_bits(image::resize(bytes, s.out_h, s.out_w),
                      textbook_bilinear(bytes, 0.0f, 0.0f, h, w, s.out_h, s.out_w)));
      CHECK(same_bits(image::resize(floats, s.out_h, s.out_w),
                      textbook_bilinear(floats, 0.0f, 0.0f, h, w, s.out_h, s.out_w)));
      // A fractional box partly outside the image, as decode_random_resized_crop asks for.
      const float top = 0.3f * h - 0.7f, left = 0.6f - 0.1f * w;
      const float box_height = 0.55f * h + 0.25f, box_width = 0.8f * w + 0.45f;
      CHECK(
          same_bits(image::resize_box(bytes, top, left, box_height, box_width, s.out_h, s.out_w),
                    textbook_bilinear(bytes, top, left, box_height, box_width, s.out_h, s.out_w)));
      CHECK(
          same_bits(image::resize_box(floats, top, left, box_height, box_width, s.out_h, s.out_w),
                    textbook_bilinear(floats, top, left, box_height, box_width, s.out_h, s.out_w)));
    }
  }
}

TEST_CASE("flip_left_right mirrors the pixels whole for every channel count") {
  for (std::size_t channels = 1; channels <= 5; ++channels) {
    CAPTURE(channels);
    Tensor<std::uint8_t> image(Shape{3, 7, channels});
    for (std::size_t i = 0; i < image.size(); ++i)
      image.data()[i] = static_cast<std::uint8_t>(i);
    const auto flipped = image::flip_left_right(image);
    REQUIRE(flipped.shape() == image.shape());
    for (std::size_t y = 0; y < 3; ++y)
      for (std::size_t x = 0; x < 7; ++x)
        for (std::size_t k = 0; k < channels; ++k)
          CHECK(flipped.data()[(y * 7 + x) * channels + k] ==
                image.data()[(y * 7 + 6 - x) * channels + k]);
  }
}
