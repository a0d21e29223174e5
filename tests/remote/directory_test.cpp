// The directory of names (dlasync/remote_directory.hpp) against a Redis
// server the tests start on loopback: names put, found, waited for,
// withdrawn and gone with their lease; imports by name; and a store that
// holds what no exporter put there.
#include "dlasync/remote_directory.hpp"

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "asio/bind_cancellation_slot.hpp"
#include "asio/cancellation_signal.hpp"
#include "asio/co_spawn.hpp"
#include "asio/use_future.hpp"
#include "catch2/catch.hpp"
#include "remote/remote_fixture.hpp"
#include "remote/remote_support.hpp"
#include "support/runtime_fixture.hpp"

namespace dlasync {
namespace {

// Where redis-server is on PATH; empty when it is not.
std::string redis_server_path() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "/usr/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    std::string candidate = dir + "/redis-server";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

std::uint16_t free_port() {
  const auto [fd, port] = loopback_socket(0);
  close(fd);
  return port;
}

// A Redis server of the test's own, on loopback, saving nothing.
class redis_server {
 public:
  explicit redis_server(std::uint16_t port = free_port()) : port_(port) {
    const std::string path = redis_server_path();
    if (path.empty()) {
      FAIL(
          "redis-server is not on PATH: the directory's tests start one on loopback; install "
          "Debian's redis-server (the README's test command does)");
    }
    process_ = std::make_unique<testing::peer_process>(
        path, std::vector<std::string>{"--port", std::to_string(port_), "--bind", "127.0.0.1",
                                       "--save", "", "--appendonly", "no", "--logfile", "/dev/null",
                                       "--daemonize", "no"});
    REQUIRE(process_->running());
    // Up once it answers.
    REQUIRE(testing::eventually([&] { return remote_directory::connect(options()).ok(); }));
  }
  remote_directory_options options() const {
    remote_directory_options o;
    o.port = port_;
    o.io_timeout = std::chrono::milliseconds(1000);
    return o;
  }
  std::uint16_t port() const { return port_; }
  void stop() { process_.reset(); }

  // A command of the test's own, bypassing the directory: what a store
  // could hold that no exporter put there.
  void raw(const std::vector<std::string>& args) {
    redisContext* c = redisConnect("127.0.0.1", port_);
    REQUIRE(c != nullptr);
    REQUIRE(c->err == 0);
    std::vector<const char*> argv;
    std::vector<std::size_t> lengths;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lengths.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lengths.data()));
    REQUIRE(r != nullptr);
    INFO(std::string(r->str != nullptr ? r->str : ""));
    REQUIRE(r->type != REDIS_REPLY_ERROR);
    freeReplyObject(r);
    redisFree(c);
  }

 private:
  std::uint16_t port_;
  std::unique_ptr<testing::peer_process> process_;
};

// The subscribers to `channel` on the server at `port`: -1 when it cannot
// be asked. On any thread (no assertions).
long long subscribers_of(std::uint16_t port, const std::string& channel) {
  long long n = -1;
  if (redisContext* c = redisConnect("127.0.0.1", port); c != nullptr) {
    auto* r = static_cast<redisReply*>(
        redisCommand(c, "PUBSUB NUMSUB %b", channel.data(), channel.size()));
    if (r != nullptr && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_INTEGER) {
      n = r->element[1]->integer;
    }
    if (r != nullptr) freeReplyObject(r);
    redisFree(c);
  }
  return n;
}

// How often the server at `port` ran `command` ("evalsha", "script|load"),
// from INFO commandstats: 0 when it never did.
long long calls_of(std::uint16_t port, const std::string& command) {
  redisContext* c = redisConnect("127.0.0.1", port);
  REQUIRE(c != nullptr);
  auto* r = static_cast<redisReply*>(redisCommand(c, "INFO commandstats"));
  REQUIRE(r != nullptr);
  REQUIRE(r->type == REDIS_REPLY_STRING);
  const std::string info(r->str, r->len);
  freeReplyObject(r);
  redisFree(c);
  const std::string line = "cmdstat_" + command + ":calls=";
  const std::size_t at = info.find(line);
  return at == std::string::npos ? 0 : std::atoll(info.c_str() + at + line.size());
}

// A server on loopback that is no Redis: it answers the first command of
// each connection with `head`, then `flood_mib` MiB of 'x', then each byte
// of `trickle` `every` apart, and keeps the connection until the client
// closes it.
class fake_redis {
 public:
  struct reply {
    std::string head;
    int flood_mib = 0;
    std::string trickle;
    std::chrono::milliseconds every{0};
  };
  explicit fake_redis(reply r) : reply_(std::move(r)) {
    std::tie(fd_, port_) = loopback_socket(4);
    thread_ = std::thread([this] { serve(); });
  }
  ~fake_redis() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }
  remote_directory_options options(std::chrono::milliseconds io_timeout) const {
    remote_directory_options o;
    o.port = port_;
    o.io_timeout = io_timeout;
    return o;
  }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      char command[4096];
      pollfd pc{c, POLLIN, 0};
      if (poll(&pc, 1, 2000) > 0 && ::read(c, command, sizeof(command)) > 0) {
        const std::string block(std::size_t{1} << 20, 'x');
        bool open = send(c, reply_.head.data(), reply_.head.size(), MSG_NOSIGNAL) > 0;
        for (int i = 0; i < reply_.flood_mib && open && !stop_; ++i) {
          open = send(c, block.data(), block.size(), MSG_NOSIGNAL) > 0;
        }
        for (std::size_t i = 0; i < reply_.trickle.size() && open && !stop_; ++i) {
          std::this_thread::sleep_for(reply_.every);
          open = send(c, &reply_.trickle[i], 1, MSG_NOSIGNAL) > 0;
        }
        // Until the client goes.
        while (open && !stop_) {
          pollfd gone{c, POLLIN, 0};
          if (poll(&gone, 1, 50) > 0) open = ::read(c, command, sizeof(command)) > 0;
        }
      }
      close(c);
    }
  }

  reply reply_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A descriptor of 4 bytes at a made-up exporter: what the directory keeps
// (it is never imported).
remote_descriptor an_entry(std::uint64_t lease_id) {
  remote_descriptor d;
  d.lease_id = lease_id;
  d.exporter_address = "127.0.0.1";
  d.exporter_port = 9;
  d.type = dtypes::uint8;
  d.shape = {4};
  d.region_bytes = 4;
  d.data = d.region_begin = 0x1000;
  return d;
}

// This process's threads, as the kernel counts them.
int threads_now() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return -1;
}

// The server's clients that are subscribed (CLIENT LIST TYPE pubsub): -1
// when it cannot be asked. On any thread (no assertions).
int subscribed_clients(std::uint16_t port) {
  int n = -1;
  if (redisContext* c = redisConnect("127.0.0.1", port); c != nullptr) {
    auto* r = static_cast<redisReply*>(redisCommand(c, "CLIENT LIST TYPE pubsub"));
    if (r != nullptr && r->type == REDIS_REPLY_STRING) {
      const std::string list(r->str, r->len);
      n = static_cast<int>(std::count(list.begin(), list.end(), '\n'));
    }
    if (r != nullptr) freeReplyObject(r);
    redisFree(c);
  }
  return n;
}

std::unique_ptr<remote_directory> directory_at(const redis_server& server) {
  absl::StatusOr<std::unique_ptr<remote_directory>> d = remote_directory::connect(server.options());
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  return *std::move(d);
}

absl::StatusOr<std::vector<tensor>> import_named(remote_node& node, remote_directory& dir,
                                                 const std::string& name,
                                                 std::chrono::milliseconds wait) {
  std::future<absl::StatusOr<std::vector<tensor>>> f = asio::co_spawn(
      node.get_executor(), import_remote_named(node, dir, name, wait), asio::use_future);
  REQUIRE(f.wait_for(60s) == std::future_status::ready);
  return f.get();
}

}  // namespace

TEST_CASE("a publication found by its name is imported, and a name is taken once",
          "[remote][directory]") {
  redis_server server;
  auto dir = directory_at(server);
  node_pair nodes;
  publish_options lease;
  lease.lease = 30s;
  auto one = publish_here(nodes.out(), "transposed", {8, 4}, lease, 5);
  REQUIRE(dir->put("one", one->descriptor, lease.lease).ok());
  REQUIRE(dir->put("one", one->descriptor, lease.lease).code() == absl::StatusCode::kAlreadyExists);
  absl::StatusOr<remote_entry> found = dir->find("one");
  REQUIRE(found.ok());
  REQUIRE(std::get<remote_descriptor>(*found).encode() == one->descriptor.encode());
  absl::StatusOr<std::vector<tensor>> got = import_named(nodes.in(), *dir, "one", 1s);
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  REQUIRE(got->size() == 1);
  check_bytes(got->front(), "transposed", {8, 4}, dtypes::float32, 5);
  REQUIRE(testing::eventually([&] { return one->count.calls.load() == 1; }));

  // A bundle under a name: every member.
  const std::vector<member_spec> members = {{"contiguous", {16, 16}}, {"negative", {4, 6}}};
  auto batch = publish_bundle_here(nodes.out(), members, lease, 11);
  REQUIRE(dir->put("batch", batch->bundle, lease.lease).ok());
  got = import_named(nodes.in(), *dir, "batch", 1s);
  REQUIRE(got.ok());
  REQUIRE(got->size() == 2);
  for (std::size_t i = 0; i < members.size(); ++i) {
    check_bytes((*got)[i], members[i].layout, members[i].shape, dtypes::float32,
                11 + static_cast<unsigned>(i));
  }
  // Released by the exporter once the importer let its hold go: the
  // deleters run before their count goes with the test.
  REQUIRE(testing::eventually([&] { return batch->count.calls.load() == 2; }));
  // Withdrawn: gone, and a second withdrawal finds nothing.
  REQUIRE(dir->withdraw("batch").ok());
  REQUIRE(dir->find("batch").status().code() == absl::StatusCode::kNotFound);
  REQUIRE(dir->withdraw("batch").code() == absl::StatusCode::kNotFound);
  // The name held an import whose lease the exporter ended: the import says so.
  got = import_named(nodes.in(), *dir, "one", 1s);
  REQUIRE(got.status().code() == absl::StatusCode::kNotFound);
  REQUIRE_THAT(std::string(got.status().message()), Catch::Contains("is not published here"));
}

TEST_CASE("a name is waited for, and goes with its lease", "[remote][directory]") {
  redis_server server;
  auto dir = directory_at(server);
  node_pair nodes;
  publish_options lease;
  lease.lease = 400ms;
  auto late = publish_here(nodes.out(), "contiguous", {64}, lease, 3);
  // Catch's assertions stay on this thread: the publisher's outcome is
  // checked after it joins.
  absl::Status put = absl::UnknownError("not put");
  std::thread publisher([&] {
    std::this_thread::sleep_for(200ms);
    absl::StatusOr<std::unique_ptr<remote_directory>> writer =
        remote_directory::connect(server.options());
    put = writer.ok() ? (*writer)->put("late", late->descriptor, lease.lease) : writer.status();
  });
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<tensor>> got = import_named(nodes.in(), *dir, "late", 5s);
  publisher.join();
  INFO(put.ToString());
  REQUIRE(put.ok());
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  REQUIRE(std::chrono::steady_clock::now() - start >= 150ms);
  check_bytes(got->front(), "contiguous", {64}, dtypes::float32, 3);
  // The entry lives as long as the lease, no longer.
  REQUIRE(dir->wait_withdrawn("late", 5s).ok());
  REQUIRE(std::chrono::steady_clock::now() - start < 5s);
  REQUIRE(dir->find("late").status().code() == absl::StatusCode::kNotFound);
  // Nothing appears: DeadlineExceeded after the wait, not before.
  const auto waited = std::chrono::steady_clock::now();
  absl::StatusOr<remote_entry> never = dir->wait_for("never", 100ms);
  REQUIRE(never.status().code() == absl::StatusCode::kDeadlineExceeded);
  REQUIRE_THAT(std::string(never.status().message()), Catch::Contains("within 100 ms"));
  REQUIRE(std::chrono::steady_clock::now() - waited >= 100ms);
  REQUIRE(dir->wait_withdrawn("never", 10ms).ok());
  got = import_named(nodes.in(), *dir, "never", 50ms);
  REQUIRE(got.status().code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("a wait wakes when its name is put, withdrawn or expires, not at its next look",
          "[remote][directory]") {
  redis_server server;
  // Looks again only every 60 s unprompted: each wait below ends long
  // before, so only the name's channel (put, withdrawal) or its ttl woke it.
  remote_directory_options slow = server.options();
  slow.recheck = 60s;
  absl::StatusOr<std::unique_ptr<remote_directory>> watched = remote_directory::connect(slow);
  REQUIRE(watched.ok());
  remote_directory& dir = **watched;
  const remote_descriptor d = an_entry(7);
  absl::Status done = absl::UnknownError("not run");
  // Subscribers to the name's channel while the wait runs: 1 shows the wait
  // is subscribed, rather than polling (checked after the join, as Catch's
  // assertions stay on this thread).
  long long subscribers = -1;
  auto later = [&](const std::string& name,
                   const std::function<absl::Status(remote_directory&)>& step) {
    return std::thread([&, name, step] {
      std::this_thread::sleep_for(200ms);
      subscribers = subscribers_of(server.port(), "dlasync:" + name);
      absl::StatusOr<std::unique_ptr<remote_directory>> writer =
          remote_directory::connect(server.options());
      done = writer.ok() ? step(**writer) : writer.status();
    });
  };
  auto start = std::chrono::steady_clock::now();
  std::thread put = later("cue", [&](remote_directory& w) { return w.put("cue", d, 30s); });
  absl::StatusOr<remote_entry> found = dir.wait_for("cue", 30s);
  put.join();
  REQUIRE(done.ok());
  CHECK(subscribers == 1);
  INFO(found.status().ToString());
  REQUIRE(found.ok());
  CHECK(std::get<remote_descriptor>(*found).encode() == d.encode());
  CHECK(std::chrono::steady_clock::now() - start < 20s);

  start = std::chrono::steady_clock::now();
  subscribers = -1;
  std::thread withdraw = later("cue", [&](remote_directory& w) { return w.withdraw("cue"); });
  absl::Status gone = dir.wait_withdrawn("cue", 30s);
  withdraw.join();
  REQUIRE(done.ok());
  CHECK(subscribers == 1);
  REQUIRE(gone.ok());
  CHECK(std::chrono::steady_clock::now() - start < 20s);
  // A withdrawal with the entry publishes too.
  REQUIRE(dir.put("cue", d, 30s).ok());
  start = std::chrono::steady_clock::now();
  withdraw = later("cue", [&](remote_directory& w) { return w.withdraw("cue", d); });
  gone = dir.wait_withdrawn("cue", 30s);
  withdraw.join();
  REQUIRE(done.ok());
  REQUIRE(gone.ok());
  CHECK(std::chrono::steady_clock::now() - start < 20s);

  // A ttl's end publishes nothing: the wait wakes when the ttl the server
  // reported runs out.
  start = std::chrono::steady_clock::now();
  REQUIRE(dir.put("brief", d, 300ms).ok());
  REQUIRE(dir.wait_withdrawn("brief", 30s).ok());
  CHECK(std::chrono::steady_clock::now() - start >= 290ms);
  CHECK(std::chrono::steady_clock::now() - start < 20s);

  // A writer that publishes nothing (a plain SET): seen at the next look.
  remote_directory_options quick = server.options();
  quick.recheck = 100ms;
  absl::StatusOr<std::unique_ptr<remote_directory>> polling = remote_directory::connect(quick);
  REQUIRE(polling.ok());
  // (The waiter on a thread: Catch's assertions, in raw, stay on this one.)
  std::thread waiter([&] { found = (*polling)->wait_for("plain", 30s); });
  struct joined {
    std::thread& t;
    ~joined() {
      if (t.joinable()) t.join();  // also when an assertion below throws
    }
  } join_waiter{waiter};
  std::this_thread::sleep_for(200ms);
  server.raw({"SET", "dlasync:plain", d.encode()});
  waiter.join();
  INFO(found.status().ToString());
  REQUIRE(found.ok());

  // The recheck must be above 0.
  quick.recheck = 0ms;
  absl::StatusOr<std::unique_ptr<remote_directory>> bad = remote_directory::connect(quick);
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(bad.status().message()), Catch::Contains("recheck"));
}

TEST_CASE("the directory's scripts go by their digest, loaded again when the server loses them",
          "[remote][directory]") {
  // Before: every put and withdrawal sent its script whole (EVAL).
  redis_server server;
  auto dir = directory_at(server);
  const remote_descriptor d = an_entry(9);
  // Each of the three scripts, loaded once, then sent by its digest.
  REQUIRE(dir->put("a", d, 30s).ok());
  REQUIRE(dir->put("b", d, 30s).ok());
  REQUIRE(dir->put("b", d, 30s).code() == absl::StatusCode::kAlreadyExists);
  REQUIRE(dir->withdraw("a", d).ok());
  REQUIRE(dir->withdraw("b").ok());
  REQUIRE(dir->withdraw("b").code() == absl::StatusCode::kNotFound);
  CHECK(calls_of(server.port(), "script|load") == 3);
  CHECK(calls_of(server.port(), "evalsha") == 6);
  CHECK(calls_of(server.port(), "eval") == 0);
  // The server loses them (as a restart does): each is loaded again, once.
  server.raw({"SCRIPT", "FLUSH"});
  REQUIRE(dir->put("c", d, 30s).ok());
  REQUIRE(dir->put("e", d, 30s).ok());
  CHECK(calls_of(server.port(), "script|load") == 4);
  CHECK(calls_of(server.port(), "eval") == 0);
  REQUIRE(std::holds_alternative<remote_descriptor>(*dir->find("c")));
  REQUIRE(dir->withdraw("c", d).ok());
  CHECK(calls_of(server.port(), "script|load") == 5);
  // A server that will not load scripts (an ACL) is sent them whole.
  server.raw({"ACL", "SETUSER", "default", "-script|load"});
  auto refused = directory_at(server);
  REQUIRE(refused->put("f", d, 30s).ok());
  REQUIRE(refused->withdraw("f", d).ok());
  REQUIRE(refused->find("f").status().code() == absl::StatusCode::kNotFound);
  CHECK(calls_of(server.port(), "eval") == 2);
  CHECK(calls_of(server.port(), "script|load") == 5);
}

TEST_CASE("a wait whose subscription breaks subscribes again, and still wakes at the put",
          "[remote][directory]") {
  // Before: a watch whose connection broke (the server closed it, as
  // CLIENT KILL does, or a proxy's idle timeout) stayed broken, so the wait
  // woke only at its next recheck.
  redis_server server;
  remote_directory_options slow = server.options();
  slow.recheck = 60s;  // each wait below ends long before an unprompted look
  absl::StatusOr<std::unique_ptr<remote_directory>> watched = remote_directory::connect(slow);
  REQUIRE(watched.ok());
  const remote_descriptor d = an_entry(8);
  // The subscription, cut twice: each time the wait subscribes again
  // (seen by the server), then the name is put. Off this thread, its
  // findings checked after the join.
  int cuts = 0;
  int resubscribed = 0;
  absl::Status put = absl::UnknownError("not run");
  std::thread writer([&] {
    const auto subscribed = [&] { return subscribers_of(server.port(), "dlasync:cut") == 1; };
    const auto within = [](const std::function<bool()>& f) {
      const auto until = std::chrono::steady_clock::now() + 5s;
      while (!f()) {
        if (std::chrono::steady_clock::now() > until) return false;
        std::this_thread::sleep_for(10ms);
      }
      return true;
    };
    if (!within(subscribed)) return;
    for (int i = 0; i < 2; ++i) {
      redisContext* c = redisConnect("127.0.0.1", server.port());
      if (c == nullptr) return;
      auto* r = static_cast<redisReply*>(redisCommand(c, "CLIENT KILL TYPE pubsub"));
      if (r != nullptr && r->type == REDIS_REPLY_INTEGER && r->integer == 1) ++cuts;
      if (r != nullptr) freeReplyObject(r);
      redisFree(c);
      std::this_thread::sleep_for(50ms);
      if (within(subscribed)) ++resubscribed;
    }
    absl::StatusOr<std::unique_ptr<remote_directory>> w =
        remote_directory::connect(server.options());
    put = w.ok() ? (*w)->put("cut", d, 30s) : w.status();
  });
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<remote_entry> found = (*watched)->wait_for("cut", 15s);
  const auto took = std::chrono::steady_clock::now() - start;
  writer.join();
  CHECK(cuts == 2);
  CHECK(resubscribed == 2);
  REQUIRE(put.ok());
  INFO(found.status().ToString());
  REQUIRE(found.ok());
  CHECK(std::get<remote_descriptor>(*found).encode() == d.encode());
  CHECK(took < 10s);
}

TEST_CASE("named imports wait together, and a withdrawal never queues behind a wait",
          "[remote][directory]") {
  // Before: every named import of a directory waited on its one thread, so
  // one waiting for a name that never came held up the others, and the
  // withdrawals of names put while published, for as long as its wait.
  redis_server server;
  auto dir = directory_at(server);
  node_pair nodes;
  publish_options lease;
  lease.lease = 30s;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::future<absl::StatusOr<std::vector<tensor>>>> never;
  for (int i = 0; i < 3; ++i) {
    never.push_back(asio::co_spawn(nodes.in().get_executor(),
                                   import_remote_named(nodes.in(), *dir, "never", 4s),
                                   asio::use_future));
  }
  std::this_thread::sleep_for(100ms);  // the three are waiting
  auto p = publish_here(nodes.out(), "contiguous", {64}, lease, 12);
  REQUIRE(dir->put_while_published(nodes.out(), "here", p->descriptor, lease.lease).ok());
  absl::StatusOr<std::vector<tensor>> got = import_named(nodes.in(), *dir, "here", 4s);
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  check_bytes(got->front(), "contiguous", {64}, dtypes::float32, 12);
  // Taken: its name is withdrawn now, not once the waits above end.
  REQUIRE(dir->wait_withdrawn("here", 2s).ok());
  REQUIRE(std::chrono::steady_clock::now() - start < 3s);
  for (auto& f : never) {
    REQUIRE(f.wait_for(10s) == std::future_status::ready);
    REQUIRE(f.get().status().code() == absl::StatusCode::kDeadlineExceeded);
  }
  REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));
  // At most max_waits at once: one more is refused at once, by name.
  never.clear();
  for (std::size_t i = 0; i <= remote_directory::max_waits; ++i) {
    never.push_back(asio::co_spawn(nodes.in().get_executor(),
                                   import_remote_named(nodes.in(), *dir, "never", 3s),
                                   asio::use_future));
  }
  std::size_t refused = 0;
  std::size_t waited = 0;
  for (auto& f : never) {
    REQUIRE(f.wait_for(30s) == std::future_status::ready);
    absl::StatusOr<std::vector<tensor>> r = f.get();
    if (r.status().code() == absl::StatusCode::kResourceExhausted) {
      ++refused;
      REQUIRE_THAT(std::string(r.status().message()), Catch::Contains("max_waits"));
    } else if (r.status().code() == absl::StatusCode::kDeadlineExceeded) {
      ++waited;
    }
  }
  REQUIRE(refused == 1);
  REQUIRE(waited == remote_directory::max_waits);
}

TEST_CASE("a directory's waits share one thread and one subscription, and end when cancelled",
          "[remote][directory]") {
  // Before: each named import's wait took a thread of its own and opened a
  // connection of its own for its subscription, and could not be cancelled.
  redis_server server;
  auto dir = directory_at(server);
  node_pair nodes;
  const int threads_before = threads_now();
  constexpr int names = 64;
  std::vector<asio::cancellation_signal> signals(names);
  std::vector<std::future<absl::StatusOr<std::vector<tensor>>>> waits;
  for (int i = 0; i < names; ++i) {
    waits.push_back(
        asio::co_spawn(nodes.in().get_executor(),
                       import_remote_named(nodes.in(), *dir, "n" + std::to_string(i), 30s),
                       asio::bind_cancellation_slot(signals[static_cast<std::size_t>(i)].slot(),
                                                    asio::use_future)));
  }
  // Every name's channel subscribed, on one connection.
  REQUIRE(testing::eventually([&] {
    for (int i = 0; i < names; ++i) {
      if (subscribers_of(server.port(), "dlasync:n" + std::to_string(i)) != 1) return false;
    }
    return true;
  }));
  CHECK(subscribed_clients(server.port()) == 1);
  // One thread for them all (the directory's loop), not one each.
  const int threads_waiting = threads_now();
  INFO("threads before " << threads_before << ", while " << names << " wait " << threads_waiting);
  CHECK(threads_waiting - threads_before <= 1);
  // A name put: its wait ends with its tensor, the others wait on.
  publish_options lease;
  lease.lease = 30s;
  auto p = publish_here(nodes.out(), "contiguous", {64}, lease, 13);
  auto start = std::chrono::steady_clock::now();
  REQUIRE(dir->put_while_published(nodes.out(), "n5", p->descriptor, lease.lease).ok());
  REQUIRE(waits[5].wait_for(10s) == std::future_status::ready);
  absl::StatusOr<std::vector<tensor>> got = waits[5].get();
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  check_bytes(got->front(), "contiguous", {64}, dtypes::float32, 13);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  // A wait cancelled (terminal): Cancelled at once, the others wait on.
  start = std::chrono::steady_clock::now();
  signals[7].emit(asio::cancellation_type::terminal);
  REQUIRE(waits[7].wait_for(10s) == std::future_status::ready);
  CHECK(waits[7].get().status().code() == absl::StatusCode::kCancelled);
  CHECK(std::chrono::steady_clock::now() - start < 2s);
  CHECK(waits[8].wait_for(100ms) == std::future_status::timeout);
  REQUIRE(testing::eventually(
      [&] { return subscribers_of(server.port(), "dlasync:n7") == 0; }));  // no one waits
  // The directory destroyed: the waits still under way end with Cancelled,
  // at once rather than at their deadline.
  start = std::chrono::steady_clock::now();
  dir.reset();
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  for (int i = 0; i < names; ++i) {
    if (i == 5 || i == 7) continue;
    INFO("wait " << i);
    REQUIRE(waits[static_cast<std::size_t>(i)].wait_for(10s) == std::future_status::ready);
    absl::StatusOr<std::vector<tensor>> r = waits[static_cast<std::size_t>(i)].get();
    CHECK(r.status().code() == absl::StatusCode::kCancelled);
    CHECK_THAT(std::string(r.status().message()), Catch::Contains("destroyed"));
  }
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));
}

TEST_CASE("a directory's waits stay bounded when its options, its server or its caller misbehave",
          "[remote][directory]") {
  redis_server server;
  const remote_descriptor d = an_entry(11);

  SECTION("a recheck too long for the clock waits, rather than looking in a loop") {
    // Before: now + recheck overflowed, so every look was due at once.
    remote_directory_options o = server.options();
    o.recheck = std::chrono::milliseconds::max();
    absl::StatusOr<std::unique_ptr<remote_directory>> dir = remote_directory::connect(o);
    REQUIRE(dir.ok());
    const long long before = calls_of(server.port(), "getrange");
    const auto start = std::chrono::steady_clock::now();
    REQUIRE((*dir)->wait_for("slow", 1s).status().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(std::chrono::steady_clock::now() - start < 5s);
    // A first look, one when subscribed, one at the deadline: a few.
    CHECK(calls_of(server.port(), "getrange") - before < 20);
  }

  SECTION("a subscription the server turns away for a while is made once it is let in") {
    // Before: any error reply on the subscription (here: too many clients)
    // turned subscriptions off for the directory's life, so its waits
    // polled.
    remote_directory_options o = server.options();
    o.recheck = 60s;
    absl::StatusOr<std::unique_ptr<remote_directory>> dir = remote_directory::connect(o);
    REQUIRE(dir.ok());
    REQUIRE((*dir)->put("warm", d, 30s).ok());  // the store's connection is up
    redisContext* admin = redisConnect("127.0.0.1", server.port());
    REQUIRE(admin != nullptr);
    REQUIRE(admin->err == 0);
    auto set_maxclients = [&](int n) {
      auto* r = static_cast<redisReply*>(redisCommand(admin, "CONFIG SET maxclients %d", n));
      REQUIRE(r != nullptr);
      INFO(std::string(r->str != nullptr ? r->str : ""));
      REQUIRE(r->type == REDIS_REPLY_STATUS);
      freeReplyObject(r);
    };
    set_maxclients(2);  // the directory's connection and this one: no room
    absl::StatusOr<remote_entry> found = absl::UnknownError("not run");
    std::thread waiter([&] { found = (*dir)->wait_for("let-in", 20s); });
    std::this_thread::sleep_for(500ms);  // turned away, at least once
    set_maxclients(100);
    // Subscribed now (a probe of its own needs the room too).
    const bool subscribed =
        testing::eventually([&] { return subscribers_of(server.port(), "dlasync:let-in") == 1; });
    REQUIRE((*dir)->put("let-in", d, 30s).ok());
    waiter.join();
    redisFree(admin);
    CHECK(subscribed);
    INFO(found.status().ToString());
    REQUIRE(found.ok());
  }

  SECTION("a directory destroyed before a named import's wait began ends it, read no more") {
    // Before: import_remote_named read its directory when the coroutine
    // first ran, which may be after the directory was gone.
    node_pair nodes;
    auto dir = directory_at(server);
    asio::awaitable<absl::StatusOr<std::vector<tensor>>> later =
        import_remote_named(nodes.in(), *dir, "gone", 30s);
    dir.reset();
    auto f = asio::co_spawn(nodes.in().get_executor(), std::move(later), asio::use_future);
    REQUIRE(f.wait_for(10s) == std::future_status::ready);
    absl::StatusOr<std::vector<tensor>> r = f.get();
    CHECK(r.status().code() == absl::StatusCode::kCancelled);
    CHECK_THAT(std::string(r.status().message()), Catch::Contains("destroyed"));
  }

  SECTION("a withdrawal the server refuses says so") {
    // Before: withdraw(name) took any reply that was no 0 for success.
    auto dir = directory_at(server);
    REQUIRE(dir->put("kept", d, 30s).ok());
    server.raw({"REPLICAOF", "127.0.0.1", "1"});  // read-only from now on
    absl::Status refused = dir->withdraw("kept");
    server.raw({"REPLICAOF", "NO", "ONE"});
    INFO(refused.ToString());
    CHECK(refused.code() == absl::StatusCode::kUnavailable);
    CHECK_THAT(std::string(refused.message()), Catch::Contains("READONLY"));
    // Writable again: the name goes.
    REQUIRE(testing::eventually([&] { return dir->withdraw("kept").ok(); }));
  }
}

TEST_CASE("a name put while published goes when its publication ends, long before its ttl",
          "[remote][directory]") {
  redis_server server;
  auto dir = directory_at(server);
  node_pair nodes;
  publish_options lease;
  lease.lease = 30s;
  SECTION("its importer took it") {
    const std::vector<member_spec> members = {{"contiguous", {16, 16}}, {"transposed", {5, 3}}};
    auto batch = publish_bundle_here(nodes.out(), members, lease, 21);
    REQUIRE(dir->put_while_published(nodes.out(), "batch", batch->bundle, lease.lease).ok());
    REQUIRE(dir->find("batch").ok());
    absl::StatusOr<std::vector<tensor>> got = import_named(nodes.in(), *dir, "batch", 1s);
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    REQUIRE(got->size() == 2);
    check_bytes((*got)[1], "transposed", {5, 3}, dtypes::float32, 22);
    const auto start = std::chrono::steady_clock::now();
    REQUIRE(dir->wait_withdrawn("batch", 5s).ok());
    REQUIRE(std::chrono::steady_clock::now() - start < 5s);
    // A node that did not publish the entry is refused, and nothing is put.
    auto other = publish_here(nodes.out(), "contiguous", {8}, lease, 2);
    absl::Status wrong = dir->put_while_published(nodes.in(), "other", other->descriptor, 30s);
    REQUIRE(wrong.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(wrong.message()),
                 Catch::Contains("give put_while_published the node that published it"));
    REQUIRE(dir->find("other").status().code() == absl::StatusCode::kNotFound);
    nodes.out().shutdown();  // `other` is released before its counter goes
    REQUIRE(other->count.calls.load() == 1);
  }
  SECTION("its lease ended first: the name goes with it, whatever the ttl") {
    publish_options brief;
    brief.lease = 1500ms;  // room for the put, on a busy machine
    auto p = publish_here(nodes.out(), "contiguous", {64}, brief, 4);
    REQUIRE(dir->put_while_published(nodes.out(), "brief", p->descriptor, 60s).ok());
    REQUIRE(dir->wait_withdrawn("brief", 5s).ok());
    REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));
  }
  SECTION("the exporter shut down: its names go") {
    auto a = publish_here(nodes.out(), "contiguous", {8}, lease, 5);
    auto b = publish_here(nodes.out(), "negative", {4, 4}, lease, 6);
    REQUIRE(dir->put_while_published(nodes.out(), "a", a->descriptor, 60s).ok());
    REQUIRE(dir->put_while_published(nodes.out(), "b", b->descriptor, 60s).ok());
    nodes.out().shutdown();
    REQUIRE(dir->wait_withdrawn("a", 5s).ok());
    REQUIRE(dir->wait_withdrawn("b", 5s).ok());
  }
  SECTION("ended before it was named: NotFound, and no name left") {
    publish_options brief;
    brief.lease = 50ms;
    auto p = publish_here(nodes.out(), "contiguous", {8}, brief, 7);
    REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));
    absl::Status late = dir->put_while_published(nodes.out(), "late", p->descriptor, 60s);
    REQUIRE(late.code() == absl::StatusCode::kNotFound);
    REQUIRE_THAT(std::string(late.message()), Catch::Contains("ended before it was named"));
    REQUIRE(dir->find("late").status().code() == absl::StatusCode::kNotFound);
  }
  SECTION("a name another exporter put since stays") {
    auto ours = publish_here(nodes.out(), "contiguous", {8}, lease, 8);
    auto theirs = publish_here(nodes.out(), "negative", {4, 4}, lease, 9);
    REQUIRE(dir->put_while_published(nodes.out(), "shared", ours->descriptor, 60s).ok());
    // Ours is removed by hand, and the name taken by another entry.
    server.raw({"DEL", "dlasync:shared"});
    REQUIRE(dir->put("shared", theirs->descriptor, 60s).ok());
    // Told after the directory's own callback, which queued the withdrawal.
    std::promise<void> told;
    REQUIRE(
        nodes.out()
            .when_ended(ours->descriptor.lease_id, [&told](publication_end) { told.set_value(); })
            .ok());
    REQUIRE(import_now(nodes.in(), ours->descriptor).ok());
    REQUIRE(told.get_future().wait_for(10s) == std::future_status::ready);
    dir.reset();  // the withdrawals queued finish first
    auto again = directory_at(server);
    absl::StatusOr<remote_entry> found = again->find("shared");
    REQUIRE(found.ok());
    REQUIRE(std::get<remote_descriptor>(*found).encode() == theirs->descriptor.encode());
    nodes.out().shutdown();
    REQUIRE(theirs->count.calls.load() == 1);
  }
}

TEST_CASE("a withdrawal with its entry removes the name only while it holds that entry",
          "[remote][directory]") {
  redis_server server;
  auto dir = directory_at(server);
  node_pair nodes;
  auto a = publish_here(nodes.out(), "contiguous", {8}, {}, 1);
  auto b = publish_here(nodes.out(), "contiguous", {8}, {}, 2);
  REQUIRE(dir->put("x", a->descriptor, 30s).ok());
  absl::Status other = dir->withdraw("x", b->descriptor);
  REQUIRE(other.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_THAT(std::string(other.message()), Catch::Contains("another entry under \"x\""));
  REQUIRE(dir->find("x").ok());
  REQUIRE(dir->withdraw("x", a->descriptor).ok());
  REQUIRE(dir->find("x").status().code() == absl::StatusCode::kNotFound);
  REQUIRE(dir->withdraw("x", a->descriptor).code() == absl::StatusCode::kNotFound);
  // A key of another type, which the store could hold: refused, left.
  server.raw({"HSET", "dlasync:hash", "field", "value"});
  absl::Status hash = dir->withdraw("hash", a->descriptor);
  REQUIRE(hash.code() == absl::StatusCode::kDataLoss);
  REQUIRE_THAT(std::string(hash.message()), Catch::Contains("nothing was withdrawn"));
  REQUIRE(dir->withdraw("", a->descriptor).code() == absl::StatusCode::kInvalidArgument);
  nodes.out().shutdown();
}

TEST_CASE("what the store holds is untrusted: refused by name and kind, never misread",
          "[remote][directory]") {
  redis_server server;
  auto dir = directory_at(server);
  server.raw({"SET", "dlasync:junk", "hello"});
  absl::StatusOr<remote_entry> e = dir->find("junk");
  REQUIRE(e.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(e.status().message()), Catch::Contains("DLRD"));
  server.raw({"SET", "dlasync:cut", std::string("DLRB\x02\x00\x00\x00", 8)});
  e = dir->find("cut");
  REQUIRE(e.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(e.status().message()), Catch::Contains("cut short"));
  server.raw({"HSET", "dlasync:hash", "field", "value"});
  e = dir->find("hash");
  REQUIRE(e.status().code() == absl::StatusCode::kDataLoss);
  REQUIRE_THAT(std::string(e.status().message()), Catch::Contains("WRONGTYPE"));
  server.raw({"SET", "dlasync:empty", ""});
  REQUIRE(dir->find("empty").status().code() == absl::StatusCode::kDataLoss);
  server.raw({"SET", "dlasync:huge", std::string(remote_directory::max_entry_bytes + 8, 'x')});
  e = dir->find("huge");
  REQUIRE(e.status().code() == absl::StatusCode::kOutOfRange);
  // Names and times to live out of range.
  remote_descriptor d;
  REQUIRE(dir->put("", d, 1s).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(dir->put(std::string(remote_directory::max_name_bytes + 1, 'n'), d, 1s).code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(dir->put("zero", d, 0ms).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(dir->find("").status().code() == absl::StatusCode::kInvalidArgument);
  // Another prefix keeps apart.
  remote_directory_options other = server.options();
  other.prefix = "elsewhere:";
  auto apart = remote_directory::connect(other);
  REQUIRE(apart.ok());
  REQUIRE((*apart)->find("junk").status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a server that sends more than any reply can be is cut off, not buffered",
          "[remote][directory]") {
  auto find_twice = [](const fake_redis& server, std::chrono::milliseconds io_timeout,
                       absl::StatusCode code, const std::string& words) {
    absl::StatusOr<std::unique_ptr<remote_directory>> dir =
        remote_directory::connect(server.options(io_timeout));
    REQUIRE(dir.ok());
    for (int i = 0; i < 2; ++i) {  // and again, on a new connection
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<remote_entry> e = (*dir)->find("flood");
      INFO(e.status().ToString());
      CHECK(e.status().code() == code);
      CHECK_THAT(std::string(e.status().message()), Catch::Contains(words));
      CHECK(std::chrono::steady_clock::now() - start < io_timeout + 1s);
    }
  };
  SECTION("a bulk string announced as 1 GiB") {
    // Before: hiredis read a reply whole, so it buffered all the server
    // sent (here 32 MiB, then it waited: Unavailable at io_timeout). Now
    // the directory stops past the longest reply it can get (an entry and
    // its framing) and drops the connection.
    fake_redis server({.head = "$1073741824\r\n", .flood_mib = 32, .trickle = "", .every = 0ms});
    find_twice(server, 5000ms, absl::StatusCode::kDataLoss, "bytes for one reply");
  }
  SECTION("an array announced with 2^31 elements") {
    // Before: hiredis allocated the 16 GiB of element pointers announced.
    fake_redis server({.head = "*2147483647\r\n", .flood_mib = 0, .trickle = "", .every = 0ms});
    find_twice(server, 5000ms, absl::StatusCode::kDataLoss, "no reply of the directory's");
  }
  SECTION("a reply trickled a byte at a time") {
    // Before: io_timeout bounded each read, so a byte every 400 ms kept the
    // command (and the directory's lock) for as long as the server liked.
    fake_redis server({.head = "$5\r\n", .flood_mib = 0, .trickle = "entry\r\n", .every = 400ms});
    find_twice(server, 1000ms, absl::StatusCode::kUnavailable, "no reply within io_timeout");
  }
}

TEST_CASE("a directory whose server goes says so, and finds it again when it is back",
          "[remote][directory]") {
  remote_directory_options nowhere;
  nowhere.port = free_port();
  absl::StatusOr<std::unique_ptr<remote_directory>> none = remote_directory::connect(nowhere);
  REQUIRE(none.status().code() == absl::StatusCode::kUnavailable);
  REQUIRE_THAT(std::string(none.status().message()),
               Catch::Contains("127.0.0.1 port " + std::to_string(nowhere.port)));
  remote_directory_options bad;
  bad.address = "";
  REQUIRE(remote_directory::connect(bad).status().code() == absl::StatusCode::kInvalidArgument);

  auto server = std::make_unique<redis_server>();
  const std::uint16_t port = server->port();
  auto dir = directory_at(*server);
  REQUIRE(dir->find("x").status().code() == absl::StatusCode::kNotFound);
  server->stop();
  absl::StatusOr<remote_entry> gone = dir->find("x");
  REQUIRE(gone.status().code() == absl::StatusCode::kUnavailable);
  REQUIRE_THAT(std::string(gone.status().message()),
               Catch::Contains("port " + std::to_string(port)));
  server = std::make_unique<redis_server>(port);
  REQUIRE(dir->find("x").status().code() == absl::StatusCode::kNotFound);
}

}  // namespace dlasync
