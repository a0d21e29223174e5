// The per-thread block cache behind view states (block_cache.hpp): a block
// given back is the next one taken on that thread, a block freed on another
// thread joins that thread's cache, and a thread's blocks are freed when it
// ends, also when it gives one back after its cache closed. (The ASan suite
// runs these with LeakSanitizer: a block left cached at a thread's end is a
// reported leak.)
#include "transfer/src/dlpack/block_cache.hpp"

#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "dlasync/dlasync.hpp"
#include "support/registries.hpp"
#include "support/test_tensors.hpp"

namespace dlasync::detail {
namespace {

// A size no library type has: these tests own the cache of this size.
constexpr std::size_t test_size = 1000;
using cache = block_cache<test_size>;

TEST_CASE("a block given back is the next one taken on the same thread", "[transfer][cache]") {
  std::thread([] {
    void* a = cache::take();
    cache::give(a);
    void* b = cache::take();
    CHECK(b == a);
    cache::give(b);
  }).join();
}

TEST_CASE("a block freed on another thread joins that thread's cache", "[transfer][cache]") {
  void* taken = cache::take();
  std::thread([taken] {
    cache::give(taken);
    void* again = cache::take();
    CHECK(again == taken);
    cache::give(again);
  }).join();
}

TEST_CASE("past its capacity a thread's cache frees blocks, and it frees the rest at its end",
          "[transfer][cache]") {
  std::thread([] {
    std::vector<void*> blocks;
    for (int i = 0; i < cache::capacity + 8; ++i) blocks.push_back(cache::take());
    for (void* b : blocks) cache::give(b);
    // The most recently cached come back first; the last 8 went to the heap.
    void* first = cache::take();
    CHECK(first == blocks[cache::capacity - 1]);
    cache::give(first);
  }).join();
}

struct late_giver {
  void* block = nullptr;
  ~late_giver() {
    if (block != nullptr) cache::give(block);
  }
};

TEST_CASE("a block given back after the thread's cache closed is freed, not cached",
          "[transfer][cache]") {
  std::thread([] {
    // Constructed before the cache's drain is registered, so destroyed after it.
    static thread_local late_giver late;
    late.block = cache::take();
    cache::give(cache::take());  // registers the drain
  }).join();
  SUCCEED("no leak (LeakSanitizer in the ASan suite) and no use of a closed cache");
}

TEST_CASE("views dropped on other threads run their deleters once, and imports go on",
          "[transfer][cache]") {
  testing::matrix_source m(4, 4);
  const device_registry& registry = testing::host_registry();
  constexpr int per_thread = 50;
  constexpr int threads = 4;
  std::vector<testing::deleter_count> counts(2 * threads * per_thread);
  std::vector<std::thread> droppers;
  for (int t = 0; t < threads; ++t) {
    std::vector<tensor> views;
    for (int i = 0; i < per_thread; ++i) {
      managed_tensor source = testing::make_tensor(m.spec, counts[t * per_thread + i]);
      absl::StatusOr<tensor> v = import_view(source, {}, registry);
      REQUIRE(v.ok());
      views.push_back(*std::move(v));
    }
    droppers.emplace_back([views = std::move(views)]() mutable { views.clear(); });
  }
  for (std::thread& d : droppers) d.join();
  // More views on this thread, from its cache or the heap.
  for (int i = threads * per_thread; i < 2 * threads * per_thread; ++i) {
    managed_tensor source = testing::make_tensor(m.spec, counts[i]);
    REQUIRE(import_view(source, {}, registry).ok());
  }
  for (const testing::deleter_count& c : counts) CHECK(c.calls.load() == 1);
}

}  // namespace
}  // namespace dlasync::detail
