#include <doctest/doctest.h>

#include <cstdint>
#include <loadstar/error.hpp>
#include <loadstar/tensor.hpp>
#include <numeric>
#include <optional>
#include <vector>

using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;

TEST_SUITE("tensor") {
  TEST_CASE("Shape counts elements and prints as NumPy does") {
    const Shape s{32, 28, 28};
    CHECK(s.rank() == 3);
    CHECK(s.elements() == 32 * 28 * 28);
    CHECK(s.row_elements() == 28 * 28);
    CHECK(s.str() == "(32, 28, 28)");
    CHECK(Shape{10}.str() == "(10,)");
    CHECK(Shape{}.str() == "()");
    CHECK(Shape{}.elements() == 1);
    CHECK(s.with_rows(5) == Shape{5, 28, 28});
    CHECK(s.row_shape() == Shape{28, 28});
    CHECK(s.row_shape().prepend(7) == Shape{7, 28, 28});
    CHECK(Shape(std::vector<int>{2, 3}) == Shape{2, 3});
  }

  TEST_CASE("Shape rejects negative dimensions and ranks beyond eight") {
    CHECK_THROWS_WITH_AS(Shape(std::vector<int>{2, -3}),
                         doctest::Contains("dimension 1 must be non-negative but is -3"),
                         ShapeError);
    CHECK_THROWS_WITH_AS((Shape{1, 1, 1, 1, 1, 1, 1, 1, 1}),
                         doctest::Contains("at most 8 dimensions"), ShapeError);
    Shape eight{1, 1, 1, 1, 1, 1, 1, 1};
    CHECK_THROWS_WITH_AS(eight.prepend(2), doctest::Contains("beyond rank 8"), ShapeError);
  }

  TEST_CASE("Shape refuses dimensions whose number of elements overflows") {
    constexpr std::size_t two_32 = std::size_t{1} << 32;
    // (2^32, 2^32) has 2^64 elements: elements() used to wrap to 0 and a tensor of this shape
    // got a 1-byte allocation.
    CHECK_THROWS_WITH_AS((Shape{two_32, two_32}),
                         doctest::Contains("shape (4294967296, 4294967296): the number of "
                                           "elements overflows std::size_t"),
                         ShapeError);
    CHECK_THROWS_AS(Shape(std::vector<std::uint64_t>{two_32 + 1, two_32, 3}), ShapeError);
    CHECK_THROWS_AS(Shape{two_32}.prepend(two_32), ShapeError);
    CHECK_THROWS_AS((Shape{1, two_32}).with_rows(two_32), ShapeError);
    // A zero dimension makes any shape empty, as in NumPy.
    CHECK((Shape{0, two_32, two_32}).elements() == 0);
    CHECK((Shape{two_32, two_32 - 1}).elements() == two_32 * (two_32 - 1));
    CHECK(Shape{3, 4}.bytes(8) == 96);
    CHECK_THROWS_WITH_AS(Shape{std::size_t{1} << 62}.bytes(4),
                         doctest::Contains("shape (4611686018427387904,): 4-byte elements need "
                                           "more bytes than memory can address"),
                         ShapeError);
    CHECK(Shape::checked_product(std::vector<std::uint64_t>{two_32, two_32}) == std::nullopt);
    CHECK(Shape::checked_product(std::vector<int>{2, -1}) == std::nullopt);
    CHECK(Shape::checked_product(std::vector<int>{2, 3}) == 6);
  }

  TEST_CASE("Tensor refuses a shape whose bytes overflow rather than allocating less") {
    // 2^62 elements fit in std::size_t but 2^62 floats do not fit in 2^64 bytes.
    CHECK_THROWS_WITH_AS(Tensor<float>::uninitialized(Shape{std::size_t{1} << 62}),
                         doctest::Contains("4-byte elements need more bytes than memory can "
                                           "address"),
                         ShapeError);
  }

  TEST_CASE_TEMPLATE("Tensor stores every element type row-major and aligned", T, float, double,
                     std::int32_t, std::int64_t, std::uint8_t, loadstar::float16,
                     loadstar::bfloat16) {
    Tensor<T> t({2, 3});
    CHECK(t.size() == 6);
    CHECK(t.rows() == 2);
    CHECK(t.row_size() == 3);
    CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % 64 == 0);
    for (T v : t)
      CHECK(v == T{0});
    std::iota(t.begin(), t.end(), T{0});
    CHECK(t(1, 2) == T{5});
    CHECK(t(0, 1) == T{1});
    CHECK(t.description().find(std::string(loadstar::dtype_name<T>())) == 0);
  }

  TEST_CASE("Tensor reports its dtype by NumPy name") {
    CHECK(Tensor<float>::dtype() == loadstar::DType::float32);
    CHECK(loadstar::dtype_name<double>() == "float64");
    CHECK(loadstar::dtype_name<std::int32_t>() == "int32");
    CHECK(loadstar::dtype_name<std::int64_t>() == "int64");
    CHECK(loadstar::dtype_name<std::uint8_t>() == "uint8");
    CHECK(loadstar::dtype_size(loadstar::DType::float64) == 8);
    CHECK(Tensor<float>({32, 784}).description() == "float32 tensor of shape (32, 784)");
    CHECK(Tensor<loadstar::float16>::dtype() == loadstar::DType::float16);
    CHECK(Tensor<loadstar::bfloat16>::dtype() == loadstar::DType::bfloat16);
    CHECK(loadstar::dtype_name<loadstar::float16>() == "float16");
    CHECK(loadstar::dtype_name<loadstar::bfloat16>() == "bfloat16");
    CHECK(loadstar::dtype_size(loadstar::DType::float16) == 2);
    CHECK(loadstar::dtype_size(loadstar::DType::bfloat16) == 2);
    static_assert(sizeof(loadstar::float16) == 2 && sizeof(loadstar::bfloat16) == 2);
    static_assert(loadstar::FloatingElement<loadstar::bfloat16>);
    static_assert(!loadstar::FloatingElement<std::int32_t>);
    static_assert(!loadstar::TensorElement<std::int16_t>);
  }

  TEST_CASE("Tensor construction from values checks the count") {
    Tensor<float> t({2, 2}, {1.f, 2.f, 3.f, 4.f});
    CHECK(t(1, 0) == 3.f);
    CHECK_THROWS_WITH_AS(
        Tensor<float>({2, 2}, {1.f, 2.f, 3.f}),
        doctest::Contains("tensor of shape (2, 2): expected 4 values but 3 were given"),
        ShapeError);
    Tensor<int> filled({3}, 7);
    CHECK(filled == Tensor<int>({3}, {7, 7, 7}));
  }

  TEST_CASE("Tensor slice_rows shares storage") {
    Tensor<std::int32_t> t({5, 2});
    std::iota(t.begin(), t.end(), 0);
    auto s = t.slice_rows(1, 3);
    CHECK(s.shape() == Shape{2, 2});
    CHECK(s(0, 0) == 2);
    CHECK(s(1, 1) == 5);
    CHECK(s.shares_storage_with(t));
    s(0, 0) = 100;
    CHECK(t(1, 0) == 100);
    CHECK(t.slice_rows(5, 5).size() == 0);
    CHECK(t.row(4) == Tensor<std::int32_t>({2}, {8, 9}));
  }

  TEST_CASE("Tensor slice_rows and row reject ranges outside the rows") {
    Tensor<float> t({4, 3});
    CHECK_THROWS_WITH_AS(
        t.slice_rows(2, 5),
        doctest::Contains("float32 tensor of shape (4, 3): cannot slice rows [2, 5)"), ShapeError);
    CHECK_THROWS_WITH_AS(t.slice_rows(3, 2), doctest::Contains("cannot slice rows [3, 2)"),
                         ShapeError);
    CHECK_THROWS_WITH_AS(t.row(4), doctest::Contains("row 4 is out of range"), ShapeError);
    Tensor<float> scalar(Shape{});
    CHECK_THROWS_AS(scalar.slice_rows(0, 1), ShapeError);
  }

  TEST_CASE("Tensor keeps its storage alive through a view") {
    Tensor<float> view;
    {
      Tensor<float> t({100, 10}, 3.f);
      view = t.slice_rows(90, 100);
    }
    CHECK(view.size() == 100);
    CHECK(view(9, 9) == 3.f);
  }

  TEST_CASE("Tensor gather_rows copies the named rows in order") {
    Tensor<double> t({4, 2});
    std::iota(t.begin(), t.end(), 0.0);
    const std::vector<std::size_t> idx{3, 0, 3};
    auto g = t.gather_rows(idx);
    CHECK(g == Tensor<double>({3, 2}, {6, 7, 0, 1, 6, 7}));
    CHECK_FALSE(g.shares_storage_with(t));
    const std::vector<std::int64_t> bad{1, -1};
    CHECK_THROWS_WITH_AS(t.gather_rows(bad),
                         doctest::Contains("row index -1 at position 1 is out of range"),
                         ShapeError);
    const std::vector<std::int64_t> too_big{4};
    CHECK_THROWS_WITH_AS(t.gather_rows(too_big), doctest::Contains("row index 4"), ShapeError);
    Tensor<double> wrong({2, 3});
    CHECK_THROWS_WITH_AS(
        t.gather_rows_into(std::span<const std::size_t>(idx), wrong),
        doctest::Contains("needs an output of shape (3, 2) but it has shape (2, 3)"), ShapeError);
  }

  TEST_CASE("Tensor reshape views the same elements") {
    Tensor<float> t({2, 6});
    std::iota(t.begin(), t.end(), 0.f);
    auto r = t.reshape({3, 2, 2});
    CHECK(r(2, 1, 1) == 11.f);
    CHECK(r.shares_storage_with(t));
    CHECK_THROWS_WITH_AS(
        t.reshape({5, 2}),
        doctest::Contains("float32 tensor of shape (2, 6): cannot reshape to (5, 2)"), ShapeError);
  }

  TEST_CASE("Tensor clone and cast are independent copies") {
    Tensor<std::uint8_t> t({3}, {1, 2, 255});
    auto c = t.clone();
    c(0) = 9;
    CHECK(t(0) == 1);
    auto f = t.cast<float>();
    CHECK(f == Tensor<float>({3}, {1.f, 2.f, 255.f}));
  }

  TEST_CASE("Tensor wrap views foreign memory kept alive by its owner") {
    auto owner = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4});
    auto t = Tensor<float>::wrap(owner->data(), {2, 2}, owner);
    owner.reset();
    CHECK(t(1, 1) == 4.f);
  }

  TEST_CASE("as_matrix maps a tensor for Eigen math without copies") {
    Tensor<float> a({2, 3}, {1, 2, 3, 4, 5, 6});
    Tensor<float> b({3, 2}, {1, 0, 0, 1, 1, 1});
    Tensor<float> c({2, 2});
    loadstar::as_matrix(c).noalias() = loadstar::as_matrix(a) * loadstar::as_matrix(b);
    // Computed by hand: [1+3, 2+3; 4+6, 5+6].
    CHECK(c == Tensor<float>({2, 2}, {4, 5, 10, 11}));
    CHECK(loadstar::as_vector(a).sum() == doctest::Approx(21.0));
    CHECK(loadstar::as_matrix(a).data() == a.data());
  }
}
