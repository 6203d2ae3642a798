/// \file
/// The loader process of a data-parallel rank: a process forked before `MPI_Init` that builds the
/// trial's training loader and serves its batches to the rank over a socket, so that the worker
/// processes a `SequenceAdapter` forks (at the start, at epoch boundaries, to replace one that
/// died) are always forked from a process that never initialised MPI.
#pragma once

#include "loadstar/config.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/data_iterator.hpp"
#include "loadstar/keras/detail/batch.hpp"

namespace loadstar::trial::detail {

/// Byte I/O on a stream socket, whole or not at all.
class Channel {
 public:
  explicit Channel(int fd = -1) noexcept : fd_(fd) {}
  int fd() const noexcept { return fd_; }

  /// Writes `n` bytes; false when the peer is gone.
  LOADSTAR_DECL bool write(const void* data, std::size_t n) const noexcept;
  /// Reads `n` bytes; false at the end of the stream (the peer is gone).
  LOADSTAR_DECL bool read(void* data, std::size_t n) const noexcept;
  template <class T>
  bool put(const T& value) const noexcept {
    return write(&value, sizeof value);
  }
  template <class T>
  bool get(T& value) const noexcept {
    return read(&value, sizeof value);
  }
  bool put_string(const std::string& text) const noexcept {
    return put(static_cast<std::uint64_t>(text.size())) && write(text.data(), text.size());
  }
  LOADSTAR_DECL bool get_string(std::string& text) const;

 private:
  int fd_;
};

/// The commands of the protocol (one byte each) and the replies' first byte.
enum class LoaderCommand : char {
  start_epoch = 'S',
  next = 'N',
  finish_epoch = 'F',
  state = 'T',
  restore = 'R',
};
inline constexpr char reply_ok = 'o';
inline constexpr char reply_end = '0';  // `next`: the epoch has no more batches
inline constexpr char reply_error = 'e';

/// The kind of a loadstar error, so that the rank rethrows what the loader process caught.
LOADSTAR_DECL char error_kind(const std::exception& e);
[[noreturn]] LOADSTAR_DECL void throw_error(char kind, const std::string& message);

/// Writes one batch: the member kinds, the row count, then each member (x, y, then the weights)
/// as dtype, key, shape and the rows' bytes, contiguous.
LOADSTAR_DECL bool put_batch(const Channel& channel, const keras::BatchView& batch,
                             std::vector<char>& scratch);

/// The loop of the loader process: answers the rank's commands from `data` until the rank is
/// gone, then ends the process.
[[noreturn]] LOADSTAR_DECL void serve_loader(const Channel& channel, keras::DataIterator& data);

/// The rank's side: a process serving one training `DataIterator`, and the batch source that
/// reads from it.
class LoaderProcess {
 public:
  /// Forks the loader process, which runs `build` (the trial's training loader as a
  /// `DataIterator`, or nothing when that loader forks no process and the rank can read it
  /// itself). Returns the process when it serves, else null (also when `build` threw: the rank
  /// builds the loader itself and meets the same error). Call before `MPI_Init`.
  LOADSTAR_DECL static std::shared_ptr<LoaderProcess> start(
      const std::function<std::optional<keras::DataIterator>()>& build);

  /// What the served iterator said of itself.
  std::optional<std::size_t> steps() const noexcept { return steps_; }
  std::size_t max_batch() const noexcept { return max_batch_; }
  bool has_targets() const noexcept { return has_targets_; }

  LOADSTAR_DECL ~LoaderProcess();
  LoaderProcess(const LoaderProcess&) = delete;
  LoaderProcess& operator=(const LoaderProcess&) = delete;

  ::pid_t pid() const noexcept { return pid_; }

  /// Sends `command` (and `payload`) and reads the reply's first byte; throws the loader's error,
  /// or `WorkerError` when the loader process is gone.
  LOADSTAR_DECL char call(LoaderCommand command,
                          const std::function<bool(const Channel&)>& payload = {});
  const Channel& channel() const noexcept { return channel_; }

  [[noreturn]] LOADSTAR_DECL void gone();

 private:
  LoaderProcess(::pid_t pid, int fd) : pid_(pid), channel_(fd) {}

  ::pid_t pid_;
  Channel channel_;
  std::optional<std::size_t> steps_;
  std::size_t max_batch_ = 0;
  bool has_targets_ = true;
};

/// The batches of a `LoaderProcess`, as a batch source of the rank: each batch is read into
/// memory the source owns and viewed from there.
class RemoteSource final : public keras::detail::BatchSource {
 public:
  explicit RemoteSource(std::shared_ptr<LoaderProcess> process)
      : process_(std::move(process)),
        steps_(process_->steps()),
        max_batch_(process_->max_batch()),
        has_targets_(process_->has_targets()) {}

  std::optional<std::size_t> steps() const override { return steps_; }
  std::size_t max_batch() const override { return max_batch_; }
  bool has_targets() const override { return has_targets_; }

  LOADSTAR_DECL void start_epoch(std::size_t epoch) override;
  LOADSTAR_DECL const keras::BatchView* next() override;
  void finish_epoch() override { process_->call(LoaderCommand::finish_epoch); }

 protected:
  std::string kind() const override { return "training data loader process"; }
  LOADSTAR_DECL nlohmann::json own_state() const override;
  LOADSTAR_DECL void restore_own(const nlohmann::json& state) override;

 private:
  LOADSTAR_DECL void decode();

  std::shared_ptr<LoaderProcess> process_;
  std::optional<std::size_t> steps_;
  std::size_t max_batch_;
  bool has_targets_;
  std::vector<char> buffer_;
  std::vector<std::string> keys_;
  keras::BatchView batch_;
};

}  // namespace loadstar::trial::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial::detail {

bool Channel::write(const void* data, std::size_t n) const noexcept {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ::ssize_t k = ::send(fd_, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

bool Channel::read(void* data, std::size_t n) const noexcept {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ::ssize_t k = ::recv(fd_, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

bool Channel::get_string(std::string& text) const {
  std::uint64_t n = 0;
  if (!get(n)) return false;
  text.resize(n);
  return read(text.data(), n);
}

char error_kind(const std::exception& e) {
  if (dynamic_cast<const ConfigError*>(&e)) return 'c';
  if (dynamic_cast<const ShapeError*>(&e)) return 's';
  if (dynamic_cast<const CheckpointError*>(&e)) return 'k';
  if (dynamic_cast<const FormatError*>(&e)) return 'f';
  if (dynamic_cast<const IoError*>(&e)) return 'i';
  return 'w';
}

void throw_error(char kind, const std::string& message) {
  switch (kind) {
    case 'c':
      throw ConfigError(message);
    case 's':
      throw ShapeError(message);
    case 'k':
      throw CheckpointError(message);
    case 'f':
      throw FormatError(message);
    case 'i':
      throw IoError(message);
    default:
      throw WorkerError(message);
  }
}

bool put_batch(const Channel& channel, const keras::BatchView& batch, std::vector<char>& scratch) {
  scratch.clear();
  const auto append = [&](const void* data, std::size_t n) {
    const auto* p = static_cast<const char*>(data);
    scratch.insert(scratch.end(), p, p + n);
  };
  const auto append_u64 = [&](std::uint64_t v) { append(&v, sizeof v); };
  const auto member = [&](const keras::detail::MemberView& m) {
    append_u64(static_cast<std::uint64_t>(m.dtype));
    const std::string key = m.key ? *m.key : std::string();
    append_u64(key.size());
    append(key.data(), key.size());
    const std::size_t rank = m.shape.rank();
    append_u64(rank);
    for (std::size_t d = 0; d < rank; ++d)
      append_u64(d == 0 && rank > 0 ? batch.count : m.shape[d]);
    const std::size_t row = m.shape.row_elements() * dtype_size(m.dtype);
    const auto* base = static_cast<const char*>(m.data);
    if (rank == 0) {
      append(base, dtype_size(m.dtype));
    } else if (batch.rows.empty()) {
      append(base + batch.offset * row, batch.count * row);
    } else {
      for (std::size_t i = 0; i < batch.count; ++i)
        append(base + batch.rows[i] * row, row);
    }
  };
  append_u64(static_cast<std::uint64_t>(batch.x_kind));
  append_u64(static_cast<std::uint64_t>(batch.y_kind));
  append_u64(batch.count);
  append_u64(batch.x.size());
  append_u64(batch.y.size());
  append_u64(batch.w ? 1 : 0);
  for (const auto& m : batch.x)
    member(m);
  for (const auto& m : batch.y)
    member(m);
  if (batch.w) member(*batch.w);
  return channel.put(reply_ok) && channel.put(static_cast<std::uint64_t>(scratch.size())) &&
         channel.write(scratch.data(), scratch.size());
}

void serve_loader(const Channel& channel, keras::DataIterator& data) {
  std::vector<char> scratch;
  for (;;) {
    char command = 0;
    if (!channel.get(command)) ::_exit(0);
    bool ok = true;
    try {
      switch (static_cast<LoaderCommand>(command)) {
        case LoaderCommand::start_epoch: {
          std::uint64_t epoch = 0;
          if (!channel.get(epoch)) ::_exit(0);
          data.start_epoch(static_cast<std::size_t>(epoch));
          ok = channel.put(reply_ok);
          break;
        }
        case LoaderCommand::next: {
          const keras::BatchView* batch = data.next();
          ok = batch ? put_batch(channel, *batch, scratch) : channel.put(reply_end);
          break;
        }
        case LoaderCommand::finish_epoch:
          data.finish_epoch();
          ok = channel.put(reply_ok);
          break;
        case LoaderCommand::state:
          ok = channel.put(reply_ok) && channel.put_string(data.state().dump());
          break;
        case LoaderCommand::restore: {
          std::string text;
          if (!channel.get_string(text)) ::_exit(0);
          data.restore(nlohmann::json::parse(text));
          ok = channel.put(reply_ok);
          break;
        }
        default:
          ::_exit(3);
      }
    } catch (const std::exception& e) {
      ok = channel.put(reply_error) && channel.put(error_kind(e)) && channel.put_string(e.what());
    }
    if (!ok) ::_exit(0);
  }
}

std::shared_ptr<LoaderProcess> LoaderProcess::start(
    const std::function<std::optional<keras::DataIterator>()>& build) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw IoError(std::string("loader process: cannot create a socket pair: ") +
                  std::strerror(errno));
  }
  const ::pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    throw IoError(std::string("loader process: cannot fork: ") + std::strerror(error));
  }
  if (pid == 0) {
    ::close(fds[0]);
    // Ends with the rank: a rank killed without closing its socket leaves no orphan.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const Channel channel(fds[1]);
    std::optional<keras::DataIterator> data;
    try {
      data = build();
    } catch (const std::exception&) {
      data.reset();
    }
    if (!data) {
      static_cast<void>(channel.put(reply_end));
      ::_exit(0);
    }
    const auto steps = data->steps();
    if (!channel.put(reply_ok) || !channel.put(static_cast<char>(steps ? 1 : 0)) ||
        !channel.put(static_cast<std::uint64_t>(steps ? *steps : 0)) ||
        !channel.put(static_cast<std::uint64_t>(data->max_batch())) ||
        !channel.put(static_cast<char>(data->has_targets() ? 1 : 0))) {
      ::_exit(0);
    }
    serve_loader(channel, *data);
  }
  ::close(fds[1]);
  auto process = std::shared_ptr<LoaderProcess>(new LoaderProcess(pid, fds[0]));
  char first = 0;
  if (!process->channel_.get(first) || first != reply_ok) return nullptr;
  char has_steps = 0, has_targets = 0;
  std::uint64_t steps = 0, max_batch = 0;
  if (!process->channel_.get(has_steps) || !process->channel_.get(steps) ||
      !process->channel_.get(max_batch) || !process->channel_.get(has_targets)) {
    return nullptr;
  }
  if (has_steps) process->steps_ = static_cast<std::size_t>(steps);
  process->max_batch_ = static_cast<std::size_t>(max_batch);
  process->has_targets_ = has_targets != 0;
  return process;
}

LoaderProcess::~LoaderProcess() {
  ::close(channel_.fd());  // the loader process sees the end of the stream and exits
  int status = 0;
  ::waitpid(pid_, &status, 0);
}

char LoaderProcess::call(LoaderCommand command,
                         const std::function<bool(const Channel&)>& payload) {
  if (!channel_.put(static_cast<char>(command)) || (payload && !payload(channel_))) gone();
  char reply = 0;
  if (!channel_.get(reply)) gone();
  if (reply == reply_error) {
    char kind = 'w';
    std::string message;
    if (!channel_.get(kind) || !channel_.get_string(message)) gone();
    throw_error(kind, message);
  }
  return reply;
}

void LoaderProcess::gone() {
  int status = 0;
  std::string how = "it closed its socket";
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    how = WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                              : "exit status " + std::to_string(WEXITSTATUS(status));
  }
  throw WorkerError("training data loader process " + std::to_string(pid_) + " ended (" + how +
                    ")");
}

void RemoteSource::start_epoch(std::size_t epoch) {
  begin_epoch(epoch);
  process_->call(LoaderCommand::start_epoch,
                 [&](const Channel& c) { return c.put(static_cast<std::uint64_t>(epoch)); });
}

const keras::BatchView* RemoteSource::next() {
  if (process_->call(LoaderCommand::next) == reply_end) return nullptr;
  std::uint64_t bytes = 0;
  if (!process_->channel().get(bytes)) process_->gone();
  buffer_.resize(bytes);
  if (!process_->channel().read(buffer_.data(), bytes)) process_->gone();
  decode();
  ++step_;
  return &batch_;
}

nlohmann::json RemoteSource::own_state() const {
  process_->call(LoaderCommand::state);
  std::string text;
  if (!process_->channel().get_string(text)) process_->gone();
  return {{"served", nlohmann::json::parse(text)}};
}

void RemoteSource::restore_own(const nlohmann::json& state) {
  const auto served = state.contains("served") ? state.at("served") : state;
  const std::string text = served.dump();
  process_->call(LoaderCommand::restore, [&](const Channel& c) { return c.put_string(text); });
}

void RemoteSource::decode() {
  std::size_t at = 0;
  const auto u64 = [&] {
    std::uint64_t v = 0;
    if (at + sizeof v > buffer_.size()) throw WorkerError("loader process: a truncated batch");
    std::memcpy(&v, buffer_.data() + at, sizeof v);
    at += sizeof v;
    return v;
  };
  batch_.x_kind = static_cast<keras::detail::MemberKind>(u64());
  batch_.y_kind = static_cast<keras::detail::MemberKind>(u64());
  batch_.count = u64();
  batch_.rows = {};
  batch_.offset = 0;
  const std::size_t nx = u64(), ny = u64(), nw = u64();
  keys_.resize(nx + ny + nw);
  std::size_t k = 0;
  const auto member = [&] {
    keras::detail::MemberView m;
    m.dtype = static_cast<DType>(u64());
    const std::size_t key_size = u64();
    keys_[k].assign(buffer_.data() + at, key_size);
    at += key_size;
    m.key = key_size ? &keys_[k] : nullptr;
    ++k;
    std::vector<std::size_t> dims(u64());
    for (auto& d : dims)
      d = u64();
    m.shape = Shape(dims);
    const std::size_t bytes =
        dims.empty() ? dtype_size(m.dtype) : m.shape.elements() * dtype_size(m.dtype);
    if (at + bytes > buffer_.size()) throw WorkerError("loader process: a truncated batch");
    m.data = buffer_.data() + at;
    at += bytes;
    return m;
  };
  batch_.x.clear();
  batch_.y.clear();
  for (std::size_t i = 0; i < nx; ++i)
    batch_.x.push_back(member());
  for (std::size_t i = 0; i < ny; ++i)
    batch_.y.push_back(member());
  if (nw) {
    batch_.w = member();
  } else {
    batch_.w.reset();
  }
}

}  // namespace loadstar::trial::detail
#endif
