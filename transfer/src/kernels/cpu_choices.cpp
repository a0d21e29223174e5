// Which instruction sets and stores the copy kernels use: read from the CPU
// once, and switchable by the tests (copy_kernels.hpp).

#include <atomic>

#include "transfer/src/kernels/copy_kernels.hpp"

namespace dlasync::copy_kernels {
namespace {

struct cpu_facts {
  bool avx2 = false;
  bool avx512f = false;
  bool intel = false;
  bool amd = false;
};

const cpu_facts this_cpu = [] {
  cpu_facts f;
#if defined(__x86_64__)
  __builtin_cpu_init();  // static initialization may run before libgcc's
  f.avx2 = __builtin_cpu_supports("avx2") != 0;
  f.avx512f = __builtin_cpu_supports("avx512f") != 0;
  f.intel = __builtin_cpu_is("intel") != 0;
  f.amd = __builtin_cpu_is("amd") != 0;
#endif
  return f;
}();

std::atomic<bool> avx2_allowed{true};
std::atomic<bool> avx512_allowed{true};
std::atomic<bool> streaming_everywhere{false};

}  // namespace

void allow_avx2(bool allowed) noexcept {
  avx2_allowed.store(allowed, std::memory_order_relaxed);
}

void allow_avx512(bool allowed) noexcept {
  avx512_allowed.store(allowed, std::memory_order_relaxed);
}

void allow_streaming(bool everywhere) noexcept {
  streaming_everywhere.store(everywhere, std::memory_order_relaxed);
}

bool avx2() noexcept {
  return this_cpu.avx2 && avx2_allowed.load(std::memory_order_relaxed);
}

bool avx512_tiles() noexcept {
  return this_cpu.avx512f && !this_cpu.intel && avx512_allowed.load(std::memory_order_relaxed);
}

bool streaming_stores() noexcept {
  return !this_cpu.amd || streaming_everywhere.load(std::memory_order_relaxed);
}

}  // namespace dlasync::copy_kernels
