/// \file
/// `decode_jpeg`, `decode_png`, `decode_png16`, `decode_bmp` and `decode_image`: encoded bytes to
/// an HWC `uint8` tensor, with the channel conversions of `tf.io.decode_*` (libjpeg-turbo, libpng
/// and giflib).
///
/// EXIF orientation is not applied: `tf.io.decode_jpeg`/`decode_image` ignore it, and so do
/// Keras's `load_img` and `image_dataset_from_directory` (Keras decodes through `tf.io` or PIL's
/// `Image.open`, neither of which transposes by the EXIF tag), so the pixels are as stored.
/// `<loadstar/data/image/exif.hpp>` is the opt-in (`exif_orientation`, `apply_exif_orientation`).
///
/// Errors: every libjpeg and libpng error (and every libjpeg warning, such as "premature end of
/// JPEG file") becomes a `FormatError` naming the source and what the library found. The libraries
/// report errors by `longjmp`; the jump lands in a frame that holds no C++ object with a
/// destructor (`detail::trapped`), and the exception is thrown from there.
#pragma once

#include <algorithm>
#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

// jpeglib.h needs <cstdio> first (FILE).
#include <gif_lib.h>
#include <jpeglib.h>
#include <png.h>

#include "loadstar/error.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::image {

/// Images larger than this many pixels are refused before any allocation (PIL's decompression-bomb
/// limit): a few header bytes could otherwise claim gigabytes.
inline constexpr std::size_t max_pixels = 178956970;

/// The format `decode_image` recognises from the first bytes.
enum class ImageFormat { jpeg, png, gif, bmp, unknown };

/// The format of encoded bytes from their signature.
inline ImageFormat sniff_format(std::span<const std::uint8_t> bytes) noexcept {
  static constexpr std::uint8_t png_signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff) {
    return ImageFormat::jpeg;
  }
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), png_signature, 8) == 0) {
    return ImageFormat::png;
  }
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), "GIF8", 4) == 0) return ImageFormat::gif;
  if (bytes.size() >= 2 && bytes[0] == 'B' && bytes[1] == 'M') return ImageFormat::bmp;
  return ImageFormat::unknown;
}

namespace detail {

// Where a library's error handler jumps to, and the message it leaves.
struct DecodeTrap {
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX > 256 ? JMSG_LENGTH_MAX : 256];
};

// Runs `f` (calls into libjpeg or libpng only) and returns false when the library's error handler
// jumped back. No object with a destructor lives between this frame and the jump.
// Kept out of line, so that the caller's variables are never cached across the jump.
template <class F>
[[gnu::noinline]] bool trapped(DecodeTrap& trap, F&& f) {
  if (setjmp(trap.jump) != 0) return false;
  f();
  return true;
}

inline void check_channels(const std::string& name, int channels, const char* allowed,
                           bool four_allowed) {
  if (channels != 0 && channels != 1 && channels != 3 && !(four_allowed && channels == 4)) {
    throw ConfigError(name + ": channels must be " + allowed + " but is " +
                      std::to_string(channels));
  }
}

inline void check_pixels(const std::string& name, std::size_t height, std::size_t width) {
  if (height == 0 || width == 0 || height > max_pixels / width) {
    throw FormatError(name + ": image of " + std::to_string(height) + "x" + std::to_string(width) +
                      " pixels is empty or larger than the limit of " + std::to_string(max_pixels) +
                      " pixels");
  }
}

// libjpeg's error manager, with the trap behind it (libjpeg sees only `base`).
struct JpegErrors {
  jpeg_error_mgr base;
  DecodeTrap trap;
};

inline void jpeg_fail(j_common_ptr info) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  (*info->err->format_message)(info, errors->trap.message);
  std::longjmp(errors->trap.jump, 1);
}

// Warnings (corrupt data, a premature end of file) are errors: the image would be partly grey.
inline void jpeg_message(j_common_ptr info, int level) {
  if (level < 0) jpeg_fail(info);
}

/// A libjpeg decompressor over a byte span whose errors become `FormatError`s naming `name`.
class JpegReader {
 public:
  JpegReader(std::span<const std::uint8_t> bytes, std::string name) : name_(std::move(name)) {
    info_.err = jpeg_std_error(&errors_.base);
    errors_.base.error_exit = jpeg_fail;
    errors_.base.emit_message = jpeg_message;
    call("cannot start the decoder", [&] { jpeg_create_decompress(&info_); });
    created_ = true;
    try {
      call("cannot read the header", [&] {
        jpeg_mem_src(&info_, bytes.data(), static_cast<unsigned long>(bytes.size()));
        jpeg_read_header(&info_, TRUE);
      });
      check_pixels(name_, info_.image_height, info_.image_width);
    } catch (...) {
      // A constructor that throws runs no destructor.
      jpeg_destroy_decompress(&info_);
      throw;
    }
  }
  JpegReader(const JpegReader&) = delete;
  JpegReader& operator=(const JpegReader&) = delete;
  ~JpegReader() {
    if (created_) jpeg_destroy_decompress(&info_);
  }

  jpeg_decompress_struct& info() noexcept { return info_; }
  const std::string& name() const noexcept { return name_; }

  // Chooses the output colour space for `channels` (0: as stored); returns the channel count.
  // A CMYK (or YCCK) image decodes to CMYK, which `read_rows` turns into RGB as TensorFlow does;
  // libjpeg has no CMYK to grey, and TensorFlow fails there too.
  int set_channels(int channels) {
    if (info_.jpeg_color_space == JCS_CMYK || info_.jpeg_color_space == JCS_YCCK) {
      if (channels == 1) {
        throw FormatError(name_ +
                          ": a CMYK JPEG image decodes to RGB (channels 0 or 3), as TensorFlow "
                          "decodes it, but channels is 1");
      }
      info_.out_color_space = JCS_CMYK;
      cmyk_ = true;
      return 3;
    }
    if (channels == 0) channels = info_.num_components == 1 ? 1 : 3;
    info_.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    return channels;
  }

  // Runs `f`, which calls libjpeg; a libjpeg error throws FormatError "<name>: <what>: <message>".
  template <class F>
  void call(const char* what, F&& f) {
    if (!trapped(errors_.trap, f)) {
      throw FormatError(name_ + ": invalid JPEG data: " + what + ": " + errors_.trap.message);
    }
  }

  // Reads rows [output_scanline, last) into `out` (rows of `stride` bytes). A CMYK image's rows
  // go through a CMYK row and become RGB as TensorFlow's decode_jpeg makes them: R = K * C / 255
  // on Adobe's inverted samples, (255 - K) * (255 - C) / 255 on others, in integers.
  void read_rows(std::uint8_t* out, std::size_t stride, JDIMENSION last) {
    if (cmyk_) cmyk_row_.resize(std::size_t{info_.output_width} * 4);
    call("cannot decode the image data", [&] {
      while (info_.output_scanline < last) {
        std::uint8_t* target = out + (info_.output_scanline - first_row_) * stride;
        if (!cmyk_) {
          JSAMPROW row = target;
          jpeg_read_scanlines(&info_, &row, 1);
          continue;
        }
        JSAMPROW row = cmyk_row_.data();
        jpeg_read_scanlines(&info_, &row, 1);
        const bool adobe = info_.saw_Adobe_marker != 0;
        for (std::size_t x = 0; x < info_.output_width; ++x) {
          const int k = cmyk_row_[4 * x + 3];
          for (std::size_t i = 0; i < 3; ++i) {
            const int v = cmyk_row_[4 * x + i];
            target[3 * x + i] =
                static_cast<std::uint8_t>(adobe ? k * v / 255 : (255 - k) * (255 - v) / 255);
          }
        }
      }
    });
  }
  void set_first_row(JDIMENSION row) noexcept { first_row_ = row; }

 private:
  std::string name_;
  jpeg_decompress_struct info_{};
  JpegErrors errors_{};
  bool created_ = false;
  JDIMENSION first_row_ = 0;
  bool cmyk_ = false;
  std::vector<std::uint8_t> cmyk_row_;
};

// libpng's callbacks: errors jump to the trap, warnings (benign ancillary-chunk notes) are dropped.
struct PngSource {
  std::span<const std::uint8_t> bytes;
  std::size_t offset = 0;
  DecodeTrap trap;
};

inline void png_fail(png_structp png, png_const_charp message) {
  auto* source = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(source->trap.message, sizeof source->trap.message, "%s", message);
  std::longjmp(source->trap.jump, 1);
}
inline void png_warn(png_structp, png_const_charp) {}
inline void png_read_bytes(png_structp png, png_bytep out, png_size_t length) {
  auto* source = static_cast<PngSource*>(png_get_io_ptr(png));
  if (length > source->bytes.size() - source->offset) {
    png_error(png, "unexpected end of data (the file is truncated)");
  }
  std::memcpy(out, source->bytes.data() + source->offset, length);
  source->offset += length;
}

/// Decodes a PNG with tf.io.decode_png's conversions into `bits` (8 or 16) per sample; 16-bit
/// samples are returned as int32.
template <class T>
Tensor<T> decode_png_as(std::span<const std::uint8_t> bytes, int channels, const std::string& name,
                        int bits) {
  PngSource source{bytes, 0, {}};
  png_structp png = nullptr;
  png_infop info = nullptr;
  struct Cleanup {
    png_structp* png;
    png_infop* info;
    ~Cleanup() {
      if (*png != nullptr) png_destroy_read_struct(png, info, nullptr);
    }
  } cleanup{&png, &info};
  png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &source, png_fail, png_warn);
  if (png == nullptr) throw FormatError(name + ": cannot start the PNG decoder");
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0, out_channels = 0, passes = 1;
  std::size_t row_bytes = 0;
  auto fail = [&](const char* what) {
    return FormatError(name + ": invalid PNG data: " + what + ": " + source.trap.message);
  };
  if (!trapped(source.trap, [&] {
        info = png_create_info_struct(png);
        if (info == nullptr) png_error(png, "out of memory");
        png_set_read_fn(png, &source, png_read_bytes);
        png_read_info(png, info);
        png_get_IHDR(png, info, &width, &height, &bit_depth, &color_type, nullptr, nullptr,
                     nullptr);
      })) {
    throw fail("cannot read the header");
  }
  check_pixels(name, height, width);
  const bool has_trns = png_get_valid(png, info, PNG_INFO_tRNS) != 0;
  const bool has_alpha = (color_type & PNG_COLOR_MASK_ALPHA) != 0;
  const bool is_gray = (color_type & PNG_COLOR_MASK_COLOR) == 0;
  out_channels = channels;
  if (out_channels == 0) {
    if (color_type == PNG_COLOR_TYPE_PALETTE) {
      out_channels = has_trns ? 4 : 3;
    } else {
      out_channels = png_get_channels(png, info);
    }
  }
  if (!trapped(source.trap, [&] {
        // The order of tf.io.decode_png: alpha, depth, packing, palette, grey.
        if (out_channels % 2 == 0) {
          if (has_alpha) {
          } else if (has_trns) {
            png_set_tRNS_to_alpha(png);
          } else {
            png_set_add_alpha(png, bits == 16 ? 0xffff : 0xff, PNG_FILLER_AFTER);
          }
        } else if (has_alpha || has_trns) {
          png_set_strip_alpha(png);
        }
        if (bit_depth > 8 && bits == 8) png_set_strip_16(png);
        png_set_packing(png);
        passes = png_set_interlace_handling(png);
        if (bits == 16 && bit_depth == 16) png_set_swap(png);
        if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
        if (is_gray && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
        if (out_channels < 3) {
          if (!is_gray) png_set_rgb_to_gray(png, 1, 0.299, 0.587);
        } else if (is_gray) {
          png_set_gray_to_rgb(png);
        }
        png_read_update_info(png, info);
        row_bytes = png_get_rowbytes(png, info);
      })) {
    throw fail("cannot set up the conversion");
  }
  const int sample_bytes = bit_depth == 16 && bits == 16 ? 2 : 1;
  if (row_bytes != std::size_t{width} * static_cast<std::size_t>(out_channels * sample_bytes)) {
    throw FormatError(name + ": invalid PNG data: rows of " + std::to_string(row_bytes) +
                      " bytes where " + std::to_string(out_channels) + " channels were expected");
  }
  std::vector<std::uint8_t> pixels(row_bytes * height);
  if (!trapped(source.trap, [&] {
        for (int pass = 0; pass < passes; ++pass) {
          for (png_uint_32 y = 0; y < height; ++y) {
            png_read_row(png, pixels.data() + y * row_bytes, nullptr);
          }
        }
        png_read_end(png, nullptr);
      })) {
    throw fail("cannot decode the image data");
  }
  auto out = Tensor<T>::uninitialized(Shape{height, width, static_cast<std::size_t>(out_channels)});
  T* dst = out.data();
  const std::size_t n = out.size();
  if (sample_bytes == 2) {
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t v;
      std::memcpy(&v, pixels.data() + 2 * i, 2);
      dst[i] = static_cast<T>(v);
    }
  } else if (bits == 16) {
    // 8-bit samples widened as tf.io.decode_png(dtype=uint16) does: v * 257.
    for (std::size_t i = 0; i < n; ++i)
      dst[i] = static_cast<T>(pixels[i] * 257);
  } else {
    for (std::size_t i = 0; i < n; ++i)
      dst[i] = static_cast<T>(pixels[i]);
  }
  return out;
}

}  // namespace detail

/// The bytes of a file (`tf.io.read_file`); throws `IoError` naming it when it cannot be read.
inline std::vector<std::uint8_t> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw IoError("cannot open '" + path.string() + "'");
  const auto size = static_cast<std::size_t>(in.tellg());
  std::vector<std::uint8_t> bytes(size);
  in.seekg(0);
  if (size > 0 &&
      !in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size))) {
    throw IoError("cannot read the " + std::to_string(size) + " bytes of '" + path.string() + "'");
  }
  return bytes;
}

/// Decodes a JPEG into a `(height, width, channels)` uint8 tensor, as `tf.io.decode_jpeg`:
/// `channels` 0 keeps the stored channels (1 for grayscale, 3 otherwise), 1 gives grayscale (the
/// decoder's luma), 3 gives RGB. `name` (a file name) heads every error message. Throws
/// `ConfigError` for other channel counts and `FormatError` for corrupt or truncated data. A CMYK
/// image gives RGB as TensorFlow computes it (for `channels` 0 or 3; 1 is a `FormatError`).
/// \code
/// Tensor<std::uint8_t> image = image::decode_jpeg(bytes, 3, "cat.jpg");  // (375, 500, 3)
/// \endcode
inline Tensor<std::uint8_t> decode_jpeg(std::span<const std::uint8_t> bytes, int channels = 0,
                                        const std::string& name = "jpeg") {
  detail::check_channels(name, channels, "0, 1 or 3 for a JPEG image", false);
  detail::JpegReader reader(bytes, name);
  const int out_channels = reader.set_channels(channels);
  auto& info = reader.info();
  reader.call("cannot start decompressing", [&] { jpeg_start_decompress(&info); });
  auto out = Tensor<std::uint8_t>::uninitialized(
      Shape{info.output_height, info.output_width, static_cast<std::size_t>(out_channels)});
  reader.read_rows(out.data(), std::size_t{info.output_width} * out_channels, info.output_height);
  reader.call("cannot finish decompressing", [&] { jpeg_finish_decompress(&info); });
  return out;
}

/// Decodes a PNG into a `(height, width, channels)` uint8 tensor, as `tf.io.decode_png` with
/// `dtype=uint8`: `channels` 0 keeps the stored channels (a palette gives 3, or 4 with
/// transparency), 1 grey (`0.299 R + 0.587 G + 0.114 B`, as tf asks libpng), 3 RGB, 4 RGBA (alpha
/// from the tRNS chunk or opaque); 16-bit samples keep their high byte. Throws `ConfigError` for
/// other channel counts and `FormatError` for corrupt or truncated data.
inline Tensor<std::uint8_t> decode_png(std::span<const std::uint8_t> bytes, int channels = 0,
                                       const std::string& name = "png") {
  detail::check_channels(name, channels, "0, 1, 3 or 4", true);
  return detail::decode_png_as<std::uint8_t>(bytes, channels, name, 8);
}

/// Decodes a PNG with 16-bit samples, as `tf.io.decode_png(dtype=uint16)`: values 0..65535 held
/// in an int32 tensor (loadstar's tensors have no uint16); 8-bit images are widened by 257.
inline Tensor<std::int32_t> decode_png16(std::span<const std::uint8_t> bytes, int channels = 0,
                                         const std::string& name = "png") {
  detail::check_channels(name, channels, "0, 1, 3 or 4", true);
  return detail::decode_png_as<std::int32_t>(bytes, channels, name, 16);
}

namespace detail {

// giflib's input callback over a byte span.
struct GifSource {
  std::span<const std::uint8_t> bytes;
  std::size_t offset = 0;
};

inline int gif_read(GifFileType* gif, GifByteType* out, int length) {
  auto* source = static_cast<GifSource*>(gif->UserData);
  const std::size_t n = std::min(static_cast<std::size_t>(std::max(length, 0)),
                                 source->bytes.size() - source->offset);
  std::memcpy(out, source->bytes.data() + source->offset, n);
  source->offset += n;
  return static_cast<int>(n);
}

}  // namespace detail

namespace detail {

// One frame of a GIF: where it lies, its colours, its transparent index and its colour indices.
struct GifFrame {
  std::size_t left = 0, top = 0, width = 0, height = 0;
  std::vector<GifColorType> colours;
  int transparent = NO_TRANSPARENT_COLOR;
  std::vector<std::uint8_t> indices;
};

// Reads the first frame, or every frame with `all`, and the largest frame's size (TensorFlow's
// canvas). With `all`, a frame that cannot be read is a `FormatError`; without, a record after
// the first frame that cannot be read ends the scan there.
inline std::vector<GifFrame> read_gif(std::span<const std::uint8_t> bytes, const std::string& name,
                                      bool all, std::size_t& width, std::size_t& height) {
  GifSource source{bytes, 0};
  int error = D_GIF_SUCCEEDED;
  GifFileType* opened = DGifOpen(&source, gif_read, &error);
  const auto fail = [&](const char* what, int code) {
    const char* reason = GifErrorString(code);
    return FormatError(name + ": invalid GIF data: " + what + ": " +
                       (reason != nullptr ? reason : "unknown error"));
  };
  if (opened == nullptr) throw fail("cannot read the header", error);
  const std::unique_ptr<GifFileType, void (*)(GifFileType*)> gif(opened, [](GifFileType* g) {
    int code = D_GIF_SUCCEEDED;
    DGifCloseFile(g, &code);
  });
  GraphicsControlBlock control{};
  control.TransparentColor = NO_TRANSPARENT_COLOR;
  std::vector<GifFrame> frames;
  std::size_t seen = 0, pixels = 0;
  width = height = 0;
  // Past the frames that are read, an error ends the scan instead of failing (first frame only).
  const auto tolerated = [&] { return !all && seen > 0; };
  for (bool done = false; !done;) {
    GifRecordType type = UNDEFINED_RECORD_TYPE;
    if (DGifGetRecordType(gif.get(), &type) == GIF_ERROR) {
      if (tolerated()) break;
      throw fail("cannot read a record", gif->Error);
    }
    if (type == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* block = nullptr;
      bool broken = DGifGetExtension(gif.get(), &code, &block) == GIF_ERROR;
      if (!broken && code == GRAPHICS_EXT_FUNC_CODE && block != nullptr && block[0] >= 4)
        DGifExtensionToGCB(block[0], block + 1, &control);
      while (!broken && block != nullptr)
        broken = DGifGetExtensionNext(gif.get(), &block) == GIF_ERROR;
      if (broken) {
        if (tolerated()) break;
        throw fail("cannot read an extension", gif->Error);
      }
    } else if (type == IMAGE_DESC_RECORD_TYPE) {
      if (DGifGetImageDesc(gif.get()) == GIF_ERROR) {
        if (tolerated()) break;
        throw fail("cannot read an image descriptor", gif->Error);
      }
      const GifImageDesc& desc = gif->Image;
      const auto w = static_cast<std::size_t>(std::max(desc.Width, 0));
      const auto h = static_cast<std::size_t>(std::max(desc.Height, 0));
      width = std::max(width, w);
      height = std::max(height, h);
      if (seen++ == 0 || all) {
        check_pixels(name, h, w);
        pixels += h * w;
        if (pixels > max_pixels) check_pixels(name, pixels, 1);  // every frame's together
        GifFrame frame;
        frame.left = static_cast<std::size_t>(std::max(desc.Left, 0));
        frame.top = static_cast<std::size_t>(std::max(desc.Top, 0));
        frame.width = w;
        frame.height = h;
        const ColorMapObject* map = desc.ColorMap != nullptr ? desc.ColorMap : gif->SColorMap;
        if (map == nullptr) {
          throw FormatError(name + ": invalid GIF data: frame " + std::to_string(frames.size()) +
                            " has no colour map");
        }
        frame.colours.assign(map->Colors, map->Colors + map->ColorCount);
        frame.transparent = control.TransparentColor;
        frame.indices.resize(h * w);
        // An interlaced frame stores its rows in four passes.
        static constexpr std::size_t starts[] = {0, 4, 2, 1}, steps[] = {8, 8, 4, 2};
        const std::size_t passes = desc.Interlace ? 4 : 1;
        for (std::size_t pass = 0; pass < passes; ++pass) {
          for (std::size_t y = desc.Interlace ? starts[pass] : 0; y < h;
               y += desc.Interlace ? steps[pass] : 1) {
            if (DGifGetLine(gif.get(), frame.indices.data() + y * w, static_cast<int>(w)) ==
                GIF_ERROR) {
              throw fail(("cannot decode frame " + std::to_string(frames.size())).c_str(),
                         gif->Error);
            }
          }
        }
        frames.push_back(std::move(frame));
      } else {
        // A later frame counts for its size only: its data is skipped.
        int code_size = 0;
        GifByteType* block = nullptr;
        bool broken = DGifGetCode(gif.get(), &code_size, &block) == GIF_ERROR;
        while (!broken && block != nullptr)
          broken = DGifGetCodeNext(gif.get(), &block) == GIF_ERROR;
        if (broken) break;
      }
      control = GraphicsControlBlock{};
      control.TransparentColor = NO_TRANSPARENT_COLOR;
    } else if (type == TERMINATE_RECORD_TYPE) {
      done = true;
    }
  }
  if (frames.empty()) throw FormatError(name + ": invalid GIF data: the file holds no image");
  check_pixels(name, height * frames.size(), width);
  return frames;
}

// Draws `frame` (number `k`) into `out`, a `height x width x 3` canvas holding frame `k - 1`
// (black for the first), as TensorFlow's gif_io.cc: the frame's pixels within the canvas through
// its colours, its transparent ones left as they are.
inline void draw_gif_frame(const GifFrame& frame, const std::string& name, std::uint8_t* out,
                           std::size_t width, std::size_t height) {
  for (std::size_t y = frame.top; y < std::min(frame.top + frame.height, height); ++y) {
    for (std::size_t x = frame.left; x < std::min(frame.left + frame.width, width); ++x) {
      const int index = frame.indices[(y - frame.top) * frame.width + (x - frame.left)];
      if (index == frame.transparent) continue;
      if (index >= static_cast<int>(frame.colours.size())) {
        throw FormatError(name + ": invalid GIF data: colour index " + std::to_string(index) +
                          " past the colour map's " + std::to_string(frame.colours.size()) +
                          " colours");
      }
      const GifColorType& colour = frame.colours[static_cast<std::size_t>(index)];
      std::uint8_t* px = out + (y * width + x) * 3;
      px[0] = colour.Red;
      px[1] = colour.Green;
      px[2] = colour.Blue;
    }
  }
}

inline void check_gif_channels(const std::string& name, int channels) {
  if (channels != 0 && channels != 3) {
    throw ConfigError(name + ": channels must be 0 or 3 for a GIF image but is " +
                      std::to_string(channels));
  }
}

}  // namespace detail

/// Decodes a GIF's first frame into a `(height, width, 3)` uint8 tensor, as
/// `tf.io.decode_image(expand_animations=False)` does (TensorFlow's `gif_io.cc`): the image is as
/// wide and high as the largest frame of the file, the first frame drawn at its offset over black
/// through its colour map (or the global one), its transparent colour black. `channels` must be 0
/// or 3. Throws `ConfigError` for other channel counts and `FormatError` for data giflib cannot
/// read up to the end of the first frame, a frame without a colour map, or a colour index past
/// it; a later frame that cannot be read ends the scan for the largest frame there (TensorFlow
/// also keeps what it read).
inline Tensor<std::uint8_t> decode_gif_frame(std::span<const std::uint8_t> bytes, int channels = 0,
                                             const std::string& name = "gif") {
  detail::check_gif_channels(name, channels);
  std::size_t width = 0, height = 0;
  const auto frames = detail::read_gif(bytes, name, false, width, height);
  Tensor<std::uint8_t> out(Shape{height, width, 3}, std::uint8_t{0});
  detail::draw_gif_frame(frames.front(), name, out.data(), width, height);
  return out;
}

/// Decodes every frame of a GIF into a `(frames, height, width, 3)` uint8 tensor, as
/// `tf.io.decode_gif` (and `decode_image` with `expand_animations=True`) does: the canvas is as
/// wide and high as the largest frame; each frame starts from the one before (black for the
/// first) and draws its pixels at its offset, its transparent ones keeping what was there
/// (disposal methods are not applied, as TensorFlow does not apply them). Throws `FormatError`
/// for a frame that cannot be read (TensorFlow keeps a partly read last frame), a frame without
/// a colour map, a colour index past it, or more pixels in all than `max_pixels`.
inline Tensor<std::uint8_t> decode_gif(std::span<const std::uint8_t> bytes,
                                       const std::string& name = "gif") {
  std::size_t width = 0, height = 0;
  const auto frames = detail::read_gif(bytes, name, true, width, height);
  Tensor<std::uint8_t> out(Shape{frames.size(), height, width, 3}, std::uint8_t{0});
  const std::size_t frame_bytes = height * width * 3;
  for (std::size_t k = 0; k < frames.size(); ++k) {
    std::uint8_t* canvas = out.data() + k * frame_bytes;
    if (k > 0) std::copy_n(canvas - frame_bytes, frame_bytes, canvas);
    detail::draw_gif_frame(frames[k], name, canvas, width, height);
  }
  return out;
}

/// Decodes a BMP into a `(height, width, channels)` uint8 tensor, as `tf.io.decode_bmp` (and
/// `decode_image`) does: uncompressed rows of 8, 24 or 32 bits per pixel from the pixel data's
/// offset, bottom-up or (with a negative height) top-down, BGR(A) made RGB(A); `channels` 0 keeps
/// the stored ones (1 for 8 bits), 3 or 4 convert (an 8-bit sample repeated, an opaque alpha
/// added or the alpha dropped). As TensorFlow, an 8-bit image gives its stored samples: a grey
/// palette's greys, another palette's indices. Throws `ConfigError` for `channels` 1 (TensorFlow
/// refuses it too) and `FormatError` for other depths, compressed data, or a size other than the
/// offset plus the padded rows.
inline Tensor<std::uint8_t> decode_bmp(std::span<const std::uint8_t> bytes, int channels = 0,
                                       const std::string& name = "bmp") {
  if (channels != 0 && channels != 3 && channels != 4) {
    throw ConfigError(name + ": channels must be 0, 3 or 4 for a BMP image but is " +
                      std::to_string(channels));
  }
  if (bytes.size() < 34 || bytes[0] != 'B' || bytes[1] != 'M') {
    throw FormatError(name +
                      ": invalid BMP data: expected a header of at least 34 bytes starting "
                      "with 'BM' but found " +
                      std::to_string(bytes.size()) + " bytes");
  }
  const auto u16 = [&](std::size_t at) {
    return static_cast<std::uint32_t>(bytes[at] | (bytes[at + 1] << 8));
  };
  const auto i32 = [&](std::size_t at) {
    return static_cast<std::int32_t>(u16(at) | (u16(at + 2) << 16));
  };
  const std::int64_t offset = i32(10), width = i32(18), height = i32(22);
  const std::uint32_t bits = u16(28), compression = static_cast<std::uint32_t>(i32(30));
  const std::int64_t stored = bits / 8;
  if (stored != 1 && stored != 3 && stored != 4) {
    throw FormatError(name + ": invalid BMP data: expected 8, 24 or 32 bits per pixel but found " +
                      std::to_string(bits));
  }
  // BI_RGB, or BI_BITFIELDS with 32 bits (read as BGRA, as TensorFlow reads it).
  if (compression != 0 && !(compression == 3 && stored == 4)) {
    throw FormatError(name + ": compressed BMP data (compression " + std::to_string(compression) +
                      ") is not supported (uncompressed rows are)");
  }
  if (width <= 0 || height == 0 || offset < 0) {
    throw FormatError(name +
                      ": invalid BMP data: expected a positive width, a nonzero height and "
                      "a nonnegative offset but found " +
                      std::to_string(width) + ", " + std::to_string(height) + " and " +
                      std::to_string(offset));
  }
  const std::int64_t rows = height < 0 ? -height : height;
  detail::check_pixels(name, static_cast<std::size_t>(rows), static_cast<std::size_t>(width));
  const std::int64_t row_size = (stored * width + 3) / 4 * 4;
  const std::int64_t expected = offset + row_size * rows;
  if (static_cast<std::int64_t>(bytes.size()) != expected) {
    throw FormatError(name + ": invalid BMP data: expected " + std::to_string(expected) +
                      " bytes (the pixels' offset and " + std::to_string(rows) + " rows of " +
                      std::to_string(row_size) + ") but found " + std::to_string(bytes.size()));
  }
  const std::int64_t out_channels = channels == 0 ? stored : channels;
  auto out = Tensor<std::uint8_t>::uninitialized(Shape{static_cast<std::size_t>(rows),
                                                       static_cast<std::size_t>(width),
                                                       static_cast<std::size_t>(out_channels)});
  std::uint8_t* dst = out.data();
  for (std::int64_t y = 0; y < rows; ++y) {
    const std::uint8_t* row = bytes.data() + offset + (height < 0 ? y : rows - 1 - y) * row_size;
    for (std::int64_t x = 0; x < width; ++x, dst += out_channels) {
      const std::uint8_t* px = row + x * stored;
      if (stored == 1) {
        dst[0] = px[0];
        if (out_channels >= 3) dst[1] = dst[2] = px[0];
      } else {
        dst[0] = px[2];
        dst[1] = px[1];
        dst[2] = px[0];
      }
      if (out_channels == 4) dst[3] = stored == 4 ? px[3] : 0xff;
    }
  }
  return out;
}

/// Decodes a JPEG, a PNG, a BMP or a GIF, recognised by its signature, as
/// `tf.io.decode_image(channels, expand_animations)` with `dtype=uint8`: a GIF gives its first
/// frame `(height, width, 3)` (`decode_gif_frame`), or with `expand_animations` every frame
/// `(frames, height, width, 3)` (`decode_gif`); the other formats give `(height, width,
/// channels)` either way. `expand_animations` is `false` by default, where TensorFlow's is
/// `true`: one image per call, as Keras's utilities decode them. A JPEG with `channels` 4, a BMP
/// with 1 and a GIF with 1 or 4 are refused as tf refuses them.
inline Tensor<std::uint8_t> decode_image(std::span<const std::uint8_t> bytes, int channels = 0,
                                         const std::string& name = "image",
                                         bool expand_animations = false) {
  detail::check_channels(name, channels, "0, 1, 3 or 4", true);
  switch (sniff_format(bytes)) {
    case ImageFormat::jpeg:
      if (channels == 4) {
        throw FormatError(name + ": a JPEG image cannot be decoded with 4 channels (0, 1 or 3)");
      }
      return decode_jpeg(bytes, channels, name);
    case ImageFormat::png:
      return decode_png(bytes, channels, name);
    case ImageFormat::gif:
      if (!expand_animations) return decode_gif_frame(bytes, channels, name);
      detail::check_gif_channels(name, channels);
      return decode_gif(bytes, name);
    case ImageFormat::bmp:
      return decode_bmp(bytes, channels, name);
    case ImageFormat::unknown:
      break;
  }
  throw FormatError(name + ": unknown image format (expected the signature of a JPEG, a PNG or " +
                    "a BMP, found none in " + std::to_string(bytes.size()) + " bytes)");
}

}  // namespace loadstar::image
