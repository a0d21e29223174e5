#include "remote/src/directory_waits.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "remote/src/directory_watch.hpp"

namespace dlasync::remote_detail {

using std::chrono::milliseconds;

struct directory_waits::wait {
  std::uint64_t id = 0;
  std::string key;
  clock::time_point until;
  look_fn look;
  end_fn end;
  // The loop's own from here on.
  bool cue = true;         // look at the next turn (new, or cued)
  bool counted = false;    // counted in its channel: its first look found nothing
  bool ended = false;      // told; leaves the list at the turn's end
  clock::time_point next;  // the next look unprompted
  clock::time_point due = clock::time_point::max();  // as its look asked
  milliseconds backoff{1};                           // between polls, with no subscription
};

struct directory_waits::channel {
  std::size_t waits = 0;  // waits counted in it
  bool asked = false;     // SUBSCRIBE sent on the present watch
};

directory_waits::directory_waits(remote_directory_options options, std::size_t most)
    : options_(std::move(options)), most_(most) {}

directory_waits::~directory_waits() {
  stop();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void directory_waits::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    attention_.store(true, std::memory_order_release);
    wake_locked();
  }
  if (thread_.joinable()) thread_.join();
}

void directory_waits::wake_locked() {
  if (wake_fd_ < 0) return;
  const std::uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);  // a full count wakes it too
}

std::uint64_t directory_waits::add(std::string key, clock::time_point until, look_fn look,
                                   end_fn end) {
  auto w = std::make_unique<wait>();
  w->key = std::move(key);
  w->until = until;
  w->look = std::move(look);
  w->end = std::move(end);
  absl::Status refused;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      refused = absl::CancelledError("the directory is being destroyed; it waits for nothing more");
    } else if (waiting_ >= most_) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("the directory already waits for ", waiting_,
                       " names at once, its most (remote_directory::max_waits); wait for fewer "
                       "names at once, or on another directory"));
    } else if (!thread_.joinable()) {
      // The loop starts with the first wait.
      if (wake_fd_ < 0) wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      if (wake_fd_ < 0) {
        refused = absl::ResourceExhaustedError(absl::StrCat(
            "no event descriptor could be made for the directory's waits: errno ", errno));
      } else {
        try {
          thread_ = std::thread([this] { run(); });
        } catch (const std::system_error& e) {
          refused = absl::ResourceExhaustedError(
              absl::StrCat("no thread could be made for the directory's waits: ", e.what()));
        }
      }
    }
    if (refused.ok()) {
      const std::uint64_t id = w->id = ++last_id_;
      incoming_.push_back(std::move(w));
      ++waiting_;
      wake_locked();
      return id;
    }
  }
  std::move(w->end)(std::move(refused));
  return 0;
}

void directory_waits::cancel(std::uint64_t id) {
  if (id == 0) return;
  std::lock_guard lock(mutex_);
  if (stopping_) return;  // the loop ends every wait as it stops
  cancelled_.push_back(id);
  attention_.store(true, std::memory_order_release);
  wake_locked();
}

void directory_waits::run() {
  std::vector<std::unique_ptr<wait>> waits;
  std::map<std::string, channel, std::less<>> channels;
  std::unique_ptr<directory_watch> watch;
  bool refused = false;  // pub/sub refused: poll, and subscribe no more
  clock::time_point next_watch = clock::time_point::min();
  // At most a day: a longer one would overflow the clock's time points.
  const milliseconds recheck = std::min(options_.recheck, milliseconds(86400000));
  // Ends `w` (once): its place is free before its caller hears.
  auto finish = [&](wait& w, absl::Status why) {
    if (w.ended) return;
    w.ended = true;
    if (w.counted) --channels[w.key].waits;
    {
      std::lock_guard lock(mutex_);
      --waiting_;
    }
    std::move(w.end)(std::move(why));
  };
  // Every wait looks at once, and polls until a subscription cues it.
  auto unheard = [&] {
    watch.reset();
    for (auto& [key, c] : channels) c.asked = false;
    for (auto& w : waits) {
      w->cue = true;
      w->backoff = milliseconds(1);
    }
  };
  for (;;) {
    bool stop = false;
    std::vector<std::uint64_t> cancelled;
    {
      std::lock_guard lock(mutex_);
      attention_.store(false, std::memory_order_relaxed);
      for (auto& w : incoming_) waits.push_back(std::move(w));
      incoming_.clear();
      cancelled.swap(cancelled_);
      stop = stopping_;
    }
    if (stop) {
      for (auto& w : waits) {
        finish(*w, absl::CancelledError(
                       "the directory was destroyed while waiting; destroy it after its waits"));
      }
      return;
    }
    for (std::uint64_t id : cancelled) {
      for (auto& w : waits) {
        if (w->id == id) finish(*w, absl::CancelledError("the wait was cancelled"));
      }
    }
    // Looks, one at a time; a cancellation or the stop is taken after the
    // look under way, not after every look due.
    bool looked = false;
    for (auto& w : waits) {
      if (looked && attention_.load(std::memory_order_acquire)) break;
      const auto now = clock::now();
      if (w->ended || !(w->cue || now >= w->next || now >= w->due || now >= w->until)) continue;
      looked = true;
      w->cue = false;
      clock::time_point due = clock::time_point::max();
      const bool over = w->look(due);
      w->due = due;
      const auto after = clock::now();
      if (over) {
        finish(*w, absl::OkStatus());
        continue;
      }
      if (after >= w->until) {
        finish(*w, absl::DeadlineExceededError("the wait's deadline passed"));
        continue;
      }
      if (!w->counted) {
        w->counted = true;
        ++channels[w->key].waits;
      }
      if (watch != nullptr && channels[w->key].asked) {
        w->next = after + recheck;  // its channel cues it sooner
      } else {
        w->next = after + w->backoff;
        w->backoff = std::min(w->backoff * 2, milliseconds(50));
      }
    }
    std::erase_if(waits, [](const std::unique_ptr<wait>& w) { return w->ended; });
    // The subscription: a channel for each name waited on, no more.
    if (watch != nullptr && watch->broken()) unheard();
    for (auto it = channels.begin(); it != channels.end();) {
      if (it->second.waits != 0) {
        ++it;
        continue;
      }
      if (watch != nullptr && it->second.asked) watch->unsubscribe(it->first);
      it = channels.erase(it);
    }
    auto now = clock::now();
    if (watch == nullptr && !refused && !channels.empty() && now >= next_watch) {
      absl::StatusOr<std::unique_ptr<directory_watch>> opened = directory_watch::open(options_);
      if (opened.ok()) watch = *std::move(opened);
      now = clock::now();
      // However this one ended, the next comes no sooner than 100 ms after
      // it (or a recheck, when shorter): a server that closes every
      // subscription at once is not asked in a loop.
      next_watch = now + std::min(recheck, milliseconds(100));
    }
    if (watch != nullptr) {
      for (auto& [key, c] : channels) {
        if (!c.asked) {
          watch->subscribe(key);
          c.asked = true;
        }
      }
      if (watch->broken()) unheard();
    }
    // Until a wait is due, a cue comes, or a wait is added or cancelled.
    clock::time_point wake_at = clock::time_point::max();
    for (const auto& w : waits) {
      wake_at = std::min({wake_at, w->cue ? now : w->next, w->due, w->until});
    }
    if (watch == nullptr && !refused && !channels.empty()) wake_at = std::min(wake_at, next_watch);
    int timeout = -1;
    if (wake_at != clock::time_point::max()) {
      const auto ms = std::chrono::ceil<milliseconds>(wake_at - now).count();
      timeout = static_cast<int>(std::clamp<decltype(ms)>(ms, 0, 86400000));
    }
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {watch != nullptr ? watch->fd() : -1, POLLIN, 0}};
    if (::poll(fds, 2, timeout) <= 0) continue;
    if ((fds[0].revents & POLLIN) != 0) {
      std::uint64_t count = 0;
      (void)!::read(wake_fd_, &count, sizeof count);
    }
    if (watch != nullptr && fds[1].revents != 0) {
      const directory_watch::heard heard = watch->read();
      for (const std::string& key : heard.cues) {
        for (auto& w : waits) {
          if (w->key == key) w->cue = true;
        }
      }
      if (heard.refused) {
        refused = true;
        unheard();
      } else if (watch->broken()) {
        unheard();
      }
    }
  }
}

}  // namespace dlasync::remote_detail
