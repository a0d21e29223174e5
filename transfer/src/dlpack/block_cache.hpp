// Blocks of one size kept for reuse on each thread (internal): the states of
// zero-copy views. A view's state is allocated where it is imported and
// freed where its last reference goes, most often the same thread; a
// thread's few cached blocks then stand in for a malloc and a free, about a
// tenth of a zero-copy `co_await import_dlpack` (docs/performance.md).
//
// Each thread keeps at most `capacity` blocks, and frees them when it ends;
// a block freed after that goes straight back to operator delete. A block
// may be freed on another thread than the one that allocated it: it then
// joins that thread's cache. Under AddressSanitizer a cached block is
// poisoned, so that a use after the last reference is still reported, and
// LeakSanitizer sees a block a thread failed to free.
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define DLASYNC_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define DLASYNC_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define DLASYNC_POISON(p, n) ((void)(p), (void)(n))
#define DLASYNC_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace dlasync::detail {

template <std::size_t Size>
class block_cache {
 public:
  static constexpr int capacity = 16;

  static void* take() {
    slots& s = local;
    if (s.count > 0) {
      void* block = s.blocks[--s.count];
      DLASYNC_UNPOISON(block, Size);
      return block;
    }
    return ::operator new(Size);
  }

  static void give(void* block) noexcept {
    slots& s = local;
    if (s.count >= capacity || s.closed) {
      ::operator delete(block);
      return;
    }
    if (s.count == 0) arm();
    DLASYNC_POISON(block, Size);
    s.blocks[s.count++] = block;
  }

 private:
  struct slots {
    void* blocks[capacity];
    int count;
    bool closed;
  };
  // Frees the thread's blocks when the thread ends.
  struct drain {
    ~drain() {
      slots& s = local;
      while (s.count > 0) {
        void* block = s.blocks[--s.count];
        DLASYNC_UNPOISON(block, Size);
        ::operator delete(block);
      }
      s.closed = true;
    }
  };
  // Constant-initialized and trivially destructible: reading it costs no
  // guard, and it stays readable while the thread's other objects end.
  static inline thread_local constinit slots local{};

  // Registers the drain on this thread, once.
  static void arm() noexcept {
    static thread_local drain d;
    (void)d;
  }
};

// An allocator drawing single objects from block_cache: for
// std::allocate_shared, which allocates one control block holding the object.
template <typename T>
struct cached_allocator {
  using value_type = T;
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);

  cached_allocator() noexcept = default;
  template <typename U>
  explicit(false) cached_allocator(const cached_allocator<U>& /*other*/) noexcept {}

  T* allocate(std::size_t n) {
    if (n == 1) return static_cast<T*>(block_cache<sizeof(T)>::take());
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n == 1) return block_cache<sizeof(T)>::give(p);
    std::allocator<T>().deallocate(p, n);
  }
  friend bool operator==(cached_allocator /*a*/, cached_allocator /*b*/) noexcept { return true; }
};

}  // namespace dlasync::detail
