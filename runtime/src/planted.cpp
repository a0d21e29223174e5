#include "runtime/src/planted.hpp"

#include <atomic>

namespace dlasync::detail {
namespace {

std::atomic<unsigned> mistakes{0};

}  // namespace

bool planted_mistake(planted m) noexcept {
  return (mistakes.load(std::memory_order_relaxed) & static_cast<unsigned>(m)) != 0;
}

void plant_mistakes(unsigned mask) noexcept {
  mistakes.store(mask, std::memory_order_relaxed);
}

}  // namespace dlasync::detail
