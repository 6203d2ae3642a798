// BackupAndRestore: a fit interrupted by an exception, or killed with SIGKILL at random moments,
// resumes at the exact batch and ends with the weights of an uninterrupted run, bit for bit.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keras/resume_training.hpp"
#include "temp_dir.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <loadstar/random.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace loadstar;
using namespace loadstar::keras;
using test_support::TempDir;

namespace {

/// Throws after `count` training batches (counted across epochs); never when `count` is 0.
class Interrupt : public callbacks::Callback {
 public:
  explicit Interrupt(std::size_t count) : count_(count) {}
  void on_train_batch_end(std::size_t, const Logs&) override {
    if (count_ != 0 && ++seen_ == count_) throw std::runtime_error("interrupted");
  }
  std::string class_name() const override { return "Interrupt"; }

 private:
  std::size_t count_;
  std::size_t seen_ = 0;
};

/// Resets the model's carried states when training begins (after the callbacks before it).
class ForgetStates : public callbacks::Callback {
 public:
  void on_train_begin(const Logs&) override { model().reset_states(); }
  std::string class_name() const override { return "ForgetStates"; }
};

struct Run {
  std::string weights;
  callbacks::History history;
  std::shared_ptr<callbacks::BackupAndRestore> backup;
};

/// One fit with BackupAndRestore in `dir` (first in the list), the shared callbacks and an
/// `Interrupt` after `interrupt_after` batches; initial weights from `seed`.
Run run(const std::filesystem::path& dir, callbacks::SaveFreq freq, std::size_t interrupt_after,
        std::uint64_t seed = 11) {
  auto m = resume_support::model(seed);
  Run out;
  out.backup = std::make_shared<callbacks::BackupAndRestore>(
      dir, callbacks::BackupAndRestoreOptions{.save_freq = freq});
  auto list = resume_support::others();
  list.insert(list.begin(), out.backup);
  list.push_back(std::make_shared<Interrupt>(interrupt_after));
  out.history = resume_support::fit(*m, list);
  out.weights = resume_support::weight_bytes(m->get_weights());
  return out;
}

/// The weights and history of the shared training without any backup.
const Run& uninterrupted() {
  static const Run reference = [] {
    auto m = resume_support::model();
    auto list = resume_support::others();
    Run out;
    out.history = resume_support::fit(*m, list);
    out.weights = resume_support::weight_bytes(m->get_weights());
    return out;
  }();
  return reference;
}

/// The path of the helper executable, from the environment meson sets.
std::string child_path() {
  const char* path = std::getenv("LOADSTAR_RESUME_CHILD");
  return path ? path : "";
}

struct ChildResult {
  bool killed = false;
  bool exited_ok = false;
  std::vector<std::string> lines;  // what it reported before it ended
};

/// Runs the helper on `dir` and `out`; with `kill_after` batches reported, waits `delay` then
/// kills it with SIGKILL (if it is still running).
ChildResult run_child(const std::filesystem::path& dir, const std::filesystem::path& out,
                      std::size_t kill_after, std::chrono::microseconds delay) {
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  const std::string exe = child_path();
  const std::string dir_arg = dir.string();
  const std::string out_arg = out.string();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(pipe_fds[1], STDOUT_FILENO);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    char* args[] = {const_cast<char*>(exe.c_str()), const_cast<char*>(dir_arg.c_str()),
                    const_cast<char*>(out_arg.c_str()), nullptr};
    ::execv(exe.c_str(), args);
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  ChildResult result;
  std::string pending;
  std::size_t batches = 0;
  bool sent = false;
  char buffer[4096];
  for (;;) {
    const ::ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buffer, static_cast<std::size_t>(n));
    for (std::size_t end; (end = pending.find('\n')) != std::string::npos;) {
      result.lines.push_back(pending.substr(0, end));
      if (result.lines.back().rfind("batch ", 0) == 0) ++batches;
      pending.erase(0, end + 1);
    }
    if (kill_after != 0 && !sent && batches >= kill_after) {
      std::this_thread::sleep_for(delay);
      ::kill(pid, SIGKILL);
      sent = true;
    }
  }
  ::close(pipe_fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  result.killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  result.exited_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return result;
}

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("BackupAndRestore leaves an uninterrupted fit unchanged and deletes its backup") {
    TempDir dir;
    const Run with_backup = run(dir / "backup", 3, 0);
    CHECK(with_backup.weights == uninterrupted().weights);
    CHECK(with_backup.history.history == uninterrupted().history.history);
    CHECK(with_backup.backup->restored_from().empty());
    CHECK_FALSE(std::filesystem::exists(dir / "backup"));
  }

  TEST_CASE("BackupAndRestore resumes an interrupted fit at the exact batch") {
    const std::size_t steps = 20;
    struct Case {
      const char* name;
      callbacks::SaveFreq freq;
      std::size_t interrupt_after;
      const char* restored;  // the backup the second run finds
    };
    // Interrupted in the hooks of batch 47 (epoch 2 batch 6), before its backup. Every batch: the
    // backup after batch 46; every 5: after batch 45 (the 9th backup); every epoch: after epoch 1
    // (the 2nd). Interrupted at batch 41, every batch: after the last batch of epoch 1, which
    // leaves the epoch's validation and end to the resumed run.
    for (const Case c : {Case{"every batch", 1, 47, "ckpt-46"}, Case{"every 5", 5, 47, "ckpt-9"},
                         Case{"every epoch", "epoch", 47, "ckpt-2"},
                         Case{"at the end of an epoch", 1, 2 * steps + 1, "ckpt-40"}}) {
      CAPTURE(c.name);
      TempDir dir;
      CHECK_THROWS_WITH(run(dir / "backup", c.freq, c.interrupt_after), "interrupted");
      CHECK(std::filesystem::exists(dir / "backup" / c.restored / "weights.bin"));
      // Other initial weights: everything must come from the backup.
      const Run resumed = run(dir / "backup", c.freq, 0, 12345);
      CHECK(resumed.backup->restored_from() == dir / "backup" / c.restored);
      CHECK(resumed.weights == uninterrupted().weights);
      CHECK(resumed.history.history == uninterrupted().history.history);
      CHECK(resumed.history.epoch == uninterrupted().history.epoch);
      CHECK_FALSE(std::filesystem::exists(dir / "backup"));
    }
  }

  TEST_CASE("BackupAndRestore restores the best value and batch counter of ModelCheckpoint") {
    TempDir dir;
    const auto fit_with = [&](const std::string& name, std::size_t interrupt_after,
                              std::uint64_t seed) {
      auto m = resume_support::model(seed);
      auto checkpoint = std::make_shared<callbacks::ModelCheckpoint>(
          (dir / name / "m-{epoch:02d}-{batch:02d}-{loss:.4f}.weights.h5").string(),
          callbacks::ModelCheckpointOptions{.monitor = "loss",
                                            .save_best_only = true,
                                            .save_weights_only = true,
                                            .save_freq = 6});
      std::vector<std::shared_ptr<callbacks::Callback>> list = {
          std::make_shared<callbacks::BackupAndRestore>(
              dir / (name + "-backup"), callbacks::BackupAndRestoreOptions{.save_freq = 1}),
          checkpoint, std::make_shared<Interrupt>(interrupt_after)};
      resume_support::fit(*m, list);
      return checkpoint;
    };
    const auto reference = fit_with("reference", 0, 11);
    CHECK_THROWS_WITH(fit_with("resumed", 53, 11), "interrupted");
    const auto resumed = fit_with("resumed", 0, 12345);
    CHECK(resumed->best() == reference->best());
    CHECK(resumed->get_state() == reference->get_state());
    const auto files = [&](const std::string& name) {
      std::vector<std::string> names;
      for (const auto& entry : std::filesystem::directory_iterator(dir / name))
        names.push_back(entry.path().filename().string());
      std::sort(names.begin(), names.end());
      return names;
    };
    CHECK(files("resumed") == files("reference"));
    CHECK(files("reference").size() > 2);
  }

  TEST_CASE("BackupAndRestore resumes a stateful LSTM from its carried states") {
    // Each sample's states carry from batch to batch (and epoch to epoch: fit does not reset
    // them), so the resumed fit must start its first batch from the backup's states; the LSTM's
    // dropout masks follow the restored step.
    Tensor<float> x(Shape{48, 5, 2}), y(Shape{48, 1});
    for (std::size_t i = 0; i < x.size(); ++i)
      x.data()[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    for (std::size_t i = 0; i < y.size(); ++i)
      y.data()[i] = static_cast<float>(std::cos(0.91 * static_cast<double>(i)));
    const auto fit = [&](std::uint64_t seed, std::vector<std::shared_ptr<callbacks::Callback>> list)
        -> std::pair<std::string, nlohmann::json> {
      set_random_seed(seed);
      Sequential m{Input({5, 2}),
                   layers::LSTM(6, {.stateful = true, .dropout = 0.2, .recurrent_dropout = 0.2}),
                   layers::Dense(1)};
      m.compile({.optimizer = "adam", .loss = "mse"});
      set_random_seed(7);
      m.fit(x, y,
            {.epochs = 3, .batch_size = 8, .verbose = 0, .callbacks = list, .shuffle = false});
      return {resume_support::weight_bytes(m.get_weights()), m.carried_states()};
    };
    const auto reference = fit(11, {});
    REQUIRE(reference.second.size() == 1);
    const auto with_backup = [&](const std::filesystem::path& dir, std::size_t interrupt_after,
                                 std::uint64_t seed, bool forget_states) {
      std::vector<std::shared_ptr<callbacks::Callback>> list = {
          std::make_shared<callbacks::BackupAndRestore>(
              dir, callbacks::BackupAndRestoreOptions{.save_freq = 1}),
          std::make_shared<Interrupt>(interrupt_after)};
      if (forget_states) {
        // Drops what BackupAndRestore restored, as a backup without the states would.
        list.push_back(std::make_shared<ForgetStates>());
      }
      return fit(seed, list);
    };
    TempDir dir;
    CHECK_THROWS_WITH(with_backup(dir / "backup", 10, 11, false), "interrupted");
    const auto resumed = with_backup(dir / "backup", 0, 12345, false);
    CHECK(resumed.first == reference.first);
    CHECK(resumed.second == reference.second);
    // Without the carried states the resumed fit trains otherwise.
    CHECK_THROWS_WITH(with_backup(dir / "forgetful", 10, 11, true), "interrupted");
    CHECK(with_backup(dir / "forgetful", 0, 12345, true).first != reference.first);
  }

  TEST_CASE("BackupAndRestore keeps one backup and the pointer to it") {
    TempDir dir;
    CHECK_THROWS(run(dir / "backup", 4, 30));
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir / "backup"))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"checkpoint", "ckpt-7"});
    CHECK(file_bytes(dir / "backup" / "checkpoint") == "ckpt-7\n");
  }

  TEST_CASE("BackupAndRestore rejects the backup of another model or callback list") {
    TempDir dir;
    CHECK_THROWS(run(dir / "backup", 1, 5));
    // Resuming the interrupted run from the backup, refused with a message containing `expected`.
    const auto resume_refused = [&](const std::string& expected) {
      auto m = resume_support::model();
      auto list = resume_support::others();
      list.insert(list.begin(), std::make_shared<callbacks::BackupAndRestore>(dir / "backup"));
      list.push_back(std::make_shared<Interrupt>(0));
      CHECK_THROWS_WITH_AS(resume_support::fit(*m, list), doctest::Contains(expected.c_str()),
                           CheckpointError);
    };
    const auto state_file = dir / "backup" / "ckpt-4" / "state.cbor";
    const auto saved_state = [&] {
      const std::string bytes = file_bytes(state_file);
      return nlohmann::json::from_cbor(bytes.begin(), bytes.end());
    };
    const auto write_state = [&](const nlohmann::json& state) {
      const auto cbor = nlohmann::json::to_cbor(state);
      std::ofstream(state_file, std::ios::binary | std::ios::trunc)
          .write(reinterpret_cast<const char*>(cbor.data()),
                 static_cast<std::streamsize>(cbor.size()));
    };
    SUBCASE("other callbacks") {
      auto m = resume_support::model();
      std::vector<std::shared_ptr<callbacks::Callback>> list = {
          std::make_shared<callbacks::BackupAndRestore>(dir / "backup")};
      CHECK_THROWS_WITH_AS(resume_support::fit(*m, list),
                           doctest::Contains("saved with the callbacks [BackupAndRestore, "
                                             "EarlyStopping, ReduceLROnPlateau, Interrupt, "
                                             "History] but fit has [BackupAndRestore, History]"),
                           CheckpointError);
    }
    SUBCASE("another model") {
      set_random_seed(1);
      Sequential other{Input({2}), layers::Dense(8), layers::Dense(2)};
      other.compile(
          {.optimizer = optimizers::Adam(), .loss = losses::SparseCategoricalCrossentropy(true)});
      auto list = resume_support::others();
      list.insert(list.begin(), std::make_shared<callbacks::BackupAndRestore>(dir / "backup"));
      list.push_back(std::make_shared<Interrupt>(0));
      CHECK_THROWS_WITH_AS(resume_support::fit(other, list), doctest::Contains("has shape"),
                           CheckpointError);
    }
    SUBCASE("a damaged pointer") {
      std::ofstream(dir / "backup" / "checkpoint") << "elsewhere\n";
      resume_refused("expected the name of a backup (ckpt-<n>) but found 'elsewhere'");
    }
    SUBCASE("a truncated weights file") {
      const auto weights = dir / "backup" / "ckpt-4" / "weights.bin";
      const auto size = std::filesystem::file_size(weights);
      std::filesystem::resize_file(weights, size - 3);
      resume_refused("the file ends early");
    }
    SUBCASE("state text that is not UTF-8") {
      // Valid CBOR whose first string (a callback's or the model's name) holds bytes that are not
      // UTF-8: refused naming the file, not a nlohmann::json::type_error from a message.
      nlohmann::json state = saved_state();
      const std::function<bool(nlohmann::json&)> spoil = [&](nlohmann::json& value) {
        if (value.is_string()) {
          value = std::string("\x91\x40") + value.get<std::string>();
          return true;
        }
        if (value.is_structured()) {
          for (auto& item : value)
            if (spoil(item)) return true;
        }
        return false;
      };
      REQUIRE(spoil(state));
      write_state(state);
      resume_refused("backup '" + state_file.string() +
                     "': expected UTF-8 text but found the byte 0x91 at offset 0 of /");
    }
    SUBCASE("state fields that are missing or of another kind") {
      // Each is refused naming the backup and the field, never an exception of the JSON library.
      const nlohmann::json saved = saved_state();
      const auto refused = [&](const std::function<void(nlohmann::json&)>& spoil,
                               const std::string& expected) {
        nlohmann::json state = saved;
        spoil(state);
        write_state(state);
        resume_refused(expected);
      };
      REQUIRE(saved.at("data").contains("sampler"));
      refused([](nlohmann::json& s) { s["data"].erase("sampler"); },
              "array source state: the field 'sampler' is missing");
      refused([](nlohmann::json& s) { s["data"]["sampler"] = 3; },
              "sampler state: field 'epoch' must be a non-negative integer but the state is 3");
      refused([](nlohmann::json& s) { s["callbacks"][0].erase("state"); },
              "callback 0 (BackupAndRestore) state: the field 'state' is missing");
      refused([](nlohmann::json& s) { s["callbacks"][1] = 7; },
              "saved with the callbacks [BackupAndRestore, ?");
    }
  }

  TEST_CASE("BackupAndRestore options are checked and round-trip through the registry") {
    CHECK_THROWS_WITH_AS(callbacks::BackupAndRestore(""), "backup and restore: backup_dir is empty",
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        (void)callbacks::BackupAndRestoreOptions{.save_freq = 0},
        "save_freq: expected \"epoch\" or a positive number of batches but found 0", ConfigError);
    CHECK_THROWS_WITH_AS((void)callbacks::BackupAndRestoreOptions{.save_freq = "batch"},
                         doctest::Contains("but found \"batch\""), ConfigError);
    const callbacks::BackupAndRestore backup("/tmp/b",
                                             {.save_freq = 7, .delete_checkpoint = false});
    const auto config = backup.get_config();
    CHECK(config ==
          nlohmann::json{{"backup_dir", "/tmp/b"}, {"save_freq", 7}, {"delete_checkpoint", false}});
    const auto made = Registry<callbacks::Callback>::instance().create("BackupAndRestore", config);
    CHECK(made->get_config() == config);
    CHECK_THROWS_WITH_AS(
        Registry<callbacks::Callback>::instance().create("BackupAndRestore",
                                                         {{"backup_dir", "b"}, {"save_freq", "x"}}),
        doctest::Contains("save_freq: expected \"epoch\" or a positive number of batches"),
        ConfigError);
  }

  TEST_CASE("BackupAndRestore resumes bitwise after SIGKILLs at random moments" *
            doctest::timeout(300)) {
    REQUIRE_MESSAGE(!child_path().empty(), "LOADSTAR_RESUME_CHILD is not set");
    TempDir dir;
    // The helper uninterrupted: the reference, from the same executable.
    const ChildResult clean = run_child(dir / "clean", dir / "clean.bin", 0, {});
    REQUIRE(clean.exited_ok);
    const std::string reference = file_bytes(dir / "clean.bin");
    REQUIRE(!reference.empty());
    CHECK(reference == uninterrupted().weights);

    SplitMix64 rng(20261123);
    std::size_t kills = 0;
    std::size_t resumed_mid_epoch = 0;
    std::size_t runs = 0;
    for (;;) {
      REQUIRE(runs < 30);
      ++runs;
      // The first six runs are killed after 1 to 15 batches and a delay of up to 3 ms, which
      // lands anywhere in the next batches, their hooks or the writing of their backups.
      const bool kill = kills < 6;
      const std::size_t after = kill ? 1 + rng.below(15) : 0;
      const auto delay = std::chrono::microseconds(rng.below(3000));
      const ChildResult r = run_child(dir / "backup", dir / "killed.bin", after, delay);
      CAPTURE(runs);
      for (const auto& line : r.lines) {
        if (line.rfind("start ", 0) == 0 && line.substr(line.size() - 2) != " 0") {
          ++resumed_mid_epoch;
        }
      }
      if (r.exited_ok) break;
      REQUIRE(r.killed);
      ++kills;
    }
    CHECK(kills >= 3);  // a run killed late may have finished
    CHECK(resumed_mid_epoch > 0);
    CHECK(file_bytes(dir / "killed.bin") == reference);
    CHECK_FALSE(std::filesystem::exists(dir / "backup"));
  }
}
