// Test support for remote imports: the tensors both processes agree on (a
// byte pattern laid out in several layouts), hex for descriptors on a text
// channel, and the peer process (tests/remote/remote_peer.cpp) driven over
// its stdin and stdout.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "dlasync/device.hpp"
#include "dlasync/dtype.hpp"

extern char** environ;  // NOLINT(readability-redundant-declaration): POSIX's

namespace dlasync::testing {

// Byte b of a tensor's compact row-major bytes; every layout stores these.
inline unsigned char pattern_byte(std::uint64_t b, unsigned seed) {
  return static_cast<unsigned char>((b * 131 + (b >> 8) * 7 + seed) & 0xff);
}

// The layouts the peer publishes.
inline const std::vector<std::string>& layouts() {
  static const std::vector<std::string> all = {
      "contiguous",       // row-major
      "transposed",       // column-major strides over the same shape
      "every_other_row",  // rows of a twice-as-tall array
      "broadcast",        // stride 0 on the first dimension
      "negative",         // the first dimension walked backwards
      "offset",           // a byte offset into the allocation
      "wide_rows",        // every other row, rows of 32 KiB: fetched run by run
  };
  return all;
}

// A host tensor laid out as `layout` over memory it owns, holding the
// pattern in its logical order (broadcast: row 0's pattern in every row).
struct laid_out {
  std::vector<unsigned char> memory;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  // elements
  std::uint64_t byte_offset = 0;
  void* data() { return memory.data(); }
};

// The logical byte b of a tensor of `shape` that `layout` stores; equal to
// pattern_byte except for broadcasts, whose rows repeat row 0.
inline unsigned char expected_byte(const std::string& layout,
                                   const std::vector<std::int64_t>& shape, std::uint32_t elem,
                                   std::uint64_t b, unsigned seed) {
  if (layout == "broadcast" && !shape.empty()) {
    std::uint64_t row_bytes = elem;
    for (std::size_t i = 1; i < shape.size(); ++i)
      row_bytes *= static_cast<std::uint64_t>(shape[i]);
    return pattern_byte(b % row_bytes, seed);
  }
  return pattern_byte(b, seed);
}

inline laid_out lay_out(const std::string& layout, std::vector<std::int64_t> shape,
                        std::uint32_t elem, unsigned seed) {
  laid_out t;
  t.shape = shape;
  const std::size_t nd = shape.size();
  std::uint64_t count = 1;
  for (std::int64_t e : shape) count *= static_cast<std::uint64_t>(e);
  std::vector<std::int64_t> compact(nd);
  {
    std::int64_t s = 1;
    for (std::size_t i = nd; i-- > 0;) {
      compact[i] = s;
      s *= std::max<std::int64_t>(shape[i], 1);
    }
  }
  std::vector<std::int64_t> strides = compact;
  std::uint64_t alloc_elems = std::max<std::uint64_t>(count, 1);
  std::int64_t first = 0;  // element index of the first element
  if (layout == "transposed" && nd >= 2) {
    std::int64_t s = 1;
    for (std::size_t i = 0; i < nd; ++i) {
      strides[i] = s;
      s *= std::max<std::int64_t>(shape[i], 1);
    }
  } else if ((layout == "every_other_row" || layout == "wide_rows") && nd >= 1) {
    strides[0] = compact[0] * 2;
    alloc_elems = std::max<std::uint64_t>(count * 2, 1);
  } else if (layout == "broadcast" && nd >= 1) {
    strides[0] = 0;
    alloc_elems = std::max<std::uint64_t>(count / std::max<std::int64_t>(shape[0], 1), 1);
  } else if (layout == "negative" && nd >= 1) {
    strides[0] = -compact[0];
    first = (shape[0] - 1) * compact[0];
  } else if (layout == "offset") {
    first = 3;
    alloc_elems += 3;
  }
  t.strides = strides;
  t.byte_offset = static_cast<std::uint64_t>(first) * elem;
  if (layout == "contiguous") {  // the large ones: byte by byte
    t.memory.resize(alloc_elems * elem);
    for (std::uint64_t b = 0; b < t.memory.size(); ++b) t.memory[b] = pattern_byte(b, seed);
    return t;
  }
  t.memory.assign(alloc_elems * elem, 0xEE);
  // Each logical element's bytes at its strided place.
  std::vector<std::int64_t> index(nd, 0);
  for (std::uint64_t i = 0; i < count; ++i) {
    std::int64_t at = first;
    for (std::size_t d = 0; d < nd; ++d) at += index[d] * strides[d];
    for (std::uint32_t j = 0; j < elem; ++j) {
      t.memory[static_cast<std::uint64_t>(at) * elem + j] =
          expected_byte(layout, shape, elem, i * elem + j, seed);
    }
    for (std::size_t d = nd; d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return t;
}

// Compares `bytes` compact row-major bytes with what `layout` holds; the
// index of the first wrong byte, or nullopt.
inline std::optional<std::uint64_t> first_mismatch(const unsigned char* bytes, std::uint64_t n,
                                                   const std::string& layout,
                                                   const std::vector<std::int64_t>& shape,
                                                   std::uint32_t elem, unsigned seed) {
  for (std::uint64_t b = 0; b < n; ++b) {
    if (bytes[b] != expected_byte(layout, shape, elem, b, seed)) return b;
  }
  return std::nullopt;
}

// `n` bytes of a seeded generator: what a hostile peer sends, and what
// the test expects of it.
inline std::vector<unsigned char> pseudo_random(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> v(n);
  for (unsigned char& b : v) b = static_cast<unsigned char>(gen());
  return v;
}

inline std::string to_hex(std::string_view bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    out += digits[static_cast<unsigned char>(c) >> 4];
    out += digits[static_cast<unsigned char>(c) & 15];
  }
  return out;
}

inline std::string from_hex(std::string_view hex) {
  auto value = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out += static_cast<char>(value(hex[i]) * 16 + value(hex[i + 1]));
  }
  return out;
}

inline std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s;
  for (std::int64_t e : shape) s += (s.empty() ? "" : "x") + std::to_string(e);
  return s.empty() ? "scalar" : s;
}

inline std::vector<std::int64_t> parse_shape(const std::string& text) {
  std::vector<std::int64_t> shape;
  if (text == "scalar") return shape;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t x = text.find('x', pos);
    shape.push_back(std::stoll(text.substr(pos, x - pos)));
    if (x == std::string::npos) break;
    pos = x + 1;
  }
  return shape;
}

// The peer process: lines in, lines out, killed if still running at the
// end, and killed by the kernel if the test's process dies first (a failed
// test that aborts leaves no peer behind, holding the test's output open).
// Made from the test's main thread, which lives as long as its process.
class peer_process {
 public:
  peer_process(const std::string& path, const std::vector<std::string>& args) {
    std::vector<std::string> argv_s = {path};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    // Every end closes at the exec (the child's stdin and stdout are dup2's
    // copies, which stay), so no peer inherits another's pipes; `failed`
    // carries a byte back only from a child that could not exec.
    int in[2] = {-1, -1};
    int out[2] = {-1, -1};
    int failed[2] = {-1, -1};
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(failed, O_CLOEXEC) != 0) {
      for (int fd : {in[0], in[1], out[0], out[1], failed[0], failed[1]}) {
        if (fd >= 0) close(fd);
      }
      return;
    }
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ == 0) {
      // Only async-signal-safe calls between fork and exec.
      if (prctl(PR_SET_PDEATHSIG, SIGKILL) == 0 && getppid() == parent &&
          dup2(in[0], STDIN_FILENO) >= 0 && dup2(out[1], STDOUT_FILENO) >= 0) {
        execve(path.c_str(), argv.data(), ::environ);
      }
      const char no = 1;
      (void)!write(failed[1], &no, 1);
      _exit(127);
    }
    close(failed[1]);
    char no = 0;
    ssize_t n = 0;
    do {
      n = read(failed[0], &no, 1);
    } while (n < 0 && errno == EINTR);
    if (pid_ > 0 && n == 1) {  // no exec: reaped, not running
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    close(failed[0]);
    if (pid_ < 0) pid_ = -1;
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = out[0];
  }
  peer_process(const peer_process&) = delete;
  peer_process& operator=(const peer_process&) = delete;
  ~peer_process() {
    if (pid_ > 0) {
      kill_now();
    }
    if (to_ >= 0) close(to_);
    if (from_ >= 0) close(from_);
  }

  bool running() const { return pid_ > 0; }

  void send(const std::string& line) {
    std::string l = line + "\n";
    const char* p = l.data();
    std::size_t left = l.size();
    while (left > 0) {
      const ssize_t n = write(to_, p, left);
      if (n <= 0) return;
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }

  // The next line, or nullopt after `timeout` or at the end of output.
  std::optional<std::string> read_line(
      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const std::size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{from_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[65536];
      const ssize_t n = read(from_, chunk, sizeof(chunk));
      if (n <= 0) return std::nullopt;
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  // Sends `command` and returns the reply line.
  std::optional<std::string> ask(const std::string& command) {
    send(command);
    return read_line();
  }

  void kill_now() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  // Waits for the exit; its status, or -1.
  int wait_exit() {
    if (pid_ <= 0) return -1;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  int from_ = -1;
  std::string buffer_;
};

}  // namespace dlasync::testing
