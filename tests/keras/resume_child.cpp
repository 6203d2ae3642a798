// The helper process of the kill test: trains the shared problem with BackupAndRestore(save_freq
// = 1) in `argv[1]`, resuming from the backup a killed run left, and writes the final weights to
// `argv[2]` (through a temporary file renamed into place). On standard output it reports where
// it started (`start <epoch> <batch>`) and every batch it finished (`batch <epoch> <batch>`), so
// that the test can kill it at chosen points.
#include "keras/resume_training.hpp"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>

namespace {

using namespace loadstar::keras;

/// Reports the batches on standard output, unbuffered, so a kill loses none that ran.
class Reporter : public callbacks::Callback {
 public:
  void on_train_batch_begin(std::size_t batch, const Logs&) override {
    if (!started_) say("start " + std::to_string(epoch_) + " " + std::to_string(batch));
    started_ = true;
  }
  void on_epoch_begin(std::size_t epoch, const Logs&) override { epoch_ = epoch; }
  void on_train_batch_end(std::size_t batch, const Logs&) override {
    say("batch " + std::to_string(epoch_) + " " + std::to_string(batch));
  }
  std::string class_name() const override { return "Reporter"; }

 private:
  static void say(const std::string& line) {
    const std::string text = line + "\n";
    static_cast<void>(::write(STDOUT_FILENO, text.data(), text.size()));
  }
  std::size_t epoch_ = 0;
  bool started_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: resume_child <backup_dir> <weights_out>\n";
    return 2;
  }
  try {
    auto m = resume_support::model(/*seed=*/11);
    auto callbacks = resume_support::others();
    callbacks.insert(callbacks.begin(),
                     std::make_shared<callbacks::BackupAndRestore>(
                         argv[1], callbacks::BackupAndRestoreOptions{.save_freq = 1}));
    callbacks.push_back(std::make_shared<Reporter>());
    resume_support::fit(*m, callbacks);
    const std::string temporary = std::string(argv[2]) + ".tmp";
    {
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      out << resume_support::weight_bytes(m->get_weights());
      if (!out) throw loadstar::IoError("cannot write '" + temporary + "'");
    }
    std::filesystem::rename(temporary, argv[2]);
  } catch (const std::exception& e) {
    std::cerr << "resume_child: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
