#include "remote/src/directory_waits.hpp"

#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dlasync::remote_detail {

void wait_threads::run(absl::AnyInvocable<then_fn(absl::Status) &&> job) {
  // Shared with the thread, so that it is still here when none can be made.
  auto held = std::make_shared<absl::AnyInvocable<then_fn(absl::Status) &&>>(std::move(job));
  absl::Status refused;
  {
    std::lock_guard lock(mutex_);
    // Threads that ended are joined here (at once), so they do not pile up.
    std::erase_if(running_, [](running& r) {
      if (!r.done->load(std::memory_order_acquire)) return false;
      r.thread.join();
      return true;
    });
    if (joined_) {
      refused = absl::CancelledError("the directory is being destroyed; it waits for nothing more");
    } else if (running_.size() >= most_) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("the directory already waits for ", running_.size(),
                       " names at once, its most (remote_directory::max_waits); wait for fewer "
                       "names at once, or on another directory"));
    } else {
      running_.reserve(running_.size() + 1);  // no throw once the thread runs
      auto done = std::make_shared<std::atomic<bool>>(false);
      try {
        std::thread t([held, done] {
          then_fn then = std::move(*held)(absl::OkStatus());
          // Its place is free before its caller hears.
          done->store(true, std::memory_order_release);
          std::move(then)();
        });
        running_.push_back(running{std::move(t), std::move(done)});
        return;
      } catch (const std::system_error& e) {
        refused = absl::ResourceExhaustedError(
            absl::StrCat("no thread could be made for the directory's wait: ", e.what()));
      }
    }
  }
  then_fn then = std::move(*held)(std::move(refused));
  std::move(then)();
}

void wait_threads::join() {
  std::vector<running> started;
  {
    std::lock_guard lock(mutex_);
    joined_ = true;
    started = std::move(running_);
    running_.clear();
  }
  for (running& r : started) r.thread.join();
}

}  // namespace dlasync::remote_detail
