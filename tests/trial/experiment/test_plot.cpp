// The curves of an experiment: metrics.jsonl read back, and drawn by gnuplot as SVG and PNG.

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <loadstar/error.hpp>
#include <loadstar/keras/callbacks/detail/files.hpp>
#include <loadstar/trial/plot.hpp>
#include <string>

#include "temp_dir.hpp"

using loadstar::ConfigError;
using loadstar::FormatError;
using loadstar::IoError;
namespace trial = loadstar::trial;

namespace {

void write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

const char* const two_workloads =
    R"({"kind":"training","trial_id":1,"step_id":1,"batches":4,"records":128,"epochs":0.5,"metrics":{"loss":2.25,"accuracy":0.125}})"
    "\n"
    R"({"kind":"validation","trial_id":1,"step_id":1,"batches":4,"records":128,"epochs":0.5,"metrics":{"val_loss":2.0,"val_accuracy":0.25}})"
    "\n"
    R"({"kind":"training","trial_id":1,"step_id":2,"batches":8,"records":256,"epochs":1,"metrics":{"loss":1.5,"accuracy":null}})"
    "\n";

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("read_metrics reads every line of metrics.jsonl in order") {
    test_support::TempDir dir;
    write(dir / "metrics.jsonl", two_workloads);
    const auto records = trial::read_metrics(dir / "metrics.jsonl");
    REQUIRE(records.size() == 3);
    CHECK(records[0].kind == "training");
    CHECK(records[0].trial_id == 1);
    CHECK(records[0].step_id == 1);
    CHECK(records[0].batches == 4);
    CHECK(records[0].records == 128);
    CHECK(records[0].epochs == 0.5);
    CHECK(records[0].metrics.at("loss") == 2.25);
    CHECK(records[1].kind == "validation");
    CHECK(records[1].metrics.at("val_accuracy") == 0.25);
    // A null metric (NaN written by JSON) is left out rather than taken for a number.
    CHECK(records[2].metrics.size() == 1);
  }

  TEST_CASE("read_metrics ignores a partial last line and refuses a malformed one") {
    test_support::TempDir dir;
    write(dir / "partial.jsonl", std::string(two_workloads) + R"({"kind":"train)");
    CHECK(trial::read_metrics(dir / "partial.jsonl").size() == 3);

    write(dir / "bad.jsonl", std::string(two_workloads) + "{\"kind\": 3}\n");
    CHECK_THROWS_WITH_AS(trial::read_metrics(dir / "bad.jsonl"),
                         doctest::Contains("bad.jsonl': line 4: expected an object with a string "
                                           "'kind', an unsigned 'batches' and an object 'metrics' "
                                           "but found {\"kind\":3}"),
                         FormatError);
    write(dir / "garbage.jsonl", "not json\n");
    CHECK_THROWS_WITH_AS(trial::read_metrics(dir / "garbage.jsonl"),
                         doctest::Contains("garbage.jsonl': line 1: expected a JSON object but "
                                           "found text that does not parse"),
                         FormatError);
    CHECK_THROWS_AS(trial::read_metrics(dir / "missing.jsonl"), IoError);
  }

  TEST_CASE("gnuplot_script draws one panel per metric with training and validation together") {
    trial::TrialCurves curves{7, {}};
    curves.records.push_back({"training", 7, 1, 4, 128, 0.5, {{"loss", 2.0}, {"accuracy", 0.5}}});
    curves.records.push_back({"validation", 7, 1, 4, 128, 0.5, {{"val_loss", 1.75}}});
    const std::string script = trial::gnuplot_script({curves}, "out.svg", "svg", "it's a title");
    CHECK(script.find("set multiplot layout 2,1 title 'it''s a title'") != std::string::npos);
    CHECK(script.find("set output 'out.svg'") != std::string::npos);
    CHECK(script.find("title 'trial 7 loss'") != std::string::npos);
    CHECK(script.find("title 'trial 7 val_loss'") != std::string::npos);
    CHECK(script.find("title 'trial 7 accuracy'") != std::string::npos);
    CHECK(script.find("4 1.75\n") != std::string::npos);
  }

  TEST_CASE("plot_metrics writes an SVG and a PNG with gnuplot") {
    if (trial::detail::find_program("gnuplot").empty()) {
      MESSAGE("gnuplot is not installed: skipped");
      return;
    }
    test_support::TempDir dir;
    write(dir / "metrics.jsonl", two_workloads);
    const std::vector<trial::TrialCurves> curves{{1, trial::read_metrics(dir / "metrics.jsonl")}};
    trial::plot_metrics(curves, dir / "curves.svg", {.title = "test"});
    const std::string svg = loadstar::keras::detail::read_bytes(dir / "curves.svg");
    CHECK(svg.find("<svg") != std::string::npos);
    CHECK(svg.find("trial 1 val_loss") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(dir / "curves.svg.tmp"));

    trial::plot_metrics(curves, dir / "curves.png");
    const std::string png = loadstar::keras::detail::read_bytes(dir / "curves.png");
    REQUIRE(png.size() > 8);
    CHECK(png.substr(1, 3) == "PNG");

    // No metrics yet: an empty plot that says so, not an error.
    trial::plot_metrics({}, dir / "empty.svg");
    CHECK(loadstar::keras::detail::read_bytes(dir / "empty.svg").find("no metrics yet") !=
          std::string::npos);
  }

  TEST_CASE("plot_metrics refuses another extension and says when gnuplot is missing") {
    test_support::TempDir dir;
    CHECK_THROWS_WITH_AS(trial::plot_metrics({}, dir / "curves.pdf"),
                         doctest::Contains("curves.pdf': expected a file name ending in .svg or "
                                           ".png but found '.pdf'"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        trial::plot_metrics({}, dir / "curves.svg", {.gnuplot = "no-such-gnuplot-here"}),
        doctest::Contains("curves.svg': the plotting program 'no-such-gnuplot-here' was not found "
                          "on PATH (install gnuplot, e.g. Debian's gnuplot-nox"),
        IoError);
    CHECK_FALSE(std::filesystem::exists(dir / "curves.svg"));
    // A gnuplot that fails: the error names it and its status.
    CHECK_THROWS_WITH_AS(trial::plot_metrics({}, dir / "curves.svg", {.gnuplot = "/bin/false"}),
                         doctest::Contains("'/bin/false' ended with exit status 1"), IoError);
    CHECK_FALSE(std::filesystem::exists(dir / "curves.svg.tmp"));
  }
}
