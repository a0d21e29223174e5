// Remote imports against ucx_perftest, on the same transport and sizes, in
// one run, interleaved repetition by repetition (the machines are shared and
// noisy: a baseline measured at another moment is no baseline).
//
//   dlasync_bench_remote [--transports=shm,tcp] [--sizes=65536,...]
//                        [--reps=5] [--bytes_per_rep=268435456] [--window=4]
//                        [--strided] [--bundles=1,8,64,512]
//                        [--trusted[=unregistered]]
//
// Per transport, this program starts itself as the exporter
// (--serve=<transports>), which publishes one buffer per size many times
// (views of the same memory, one importer each). Per size and repetition:
//   - ucx_perftest (Debian's ucx-utils) runs a server and a client on
//     loopback with UCX_TLS set the same: ucp_get over shared memory (what
//     dlasync's RMA path does), ucp_am_bw over TCP (dlasync's active-message
//     path), -n as many messages as dlasync imports;
//   - dlasync imports that many tensors with `window` in flight, each its
//     whole protocol: validation, budget, allocation, hold, bytes, release.
// The table gives each side's rate (its median over the repetitions) and
// the median of the per-repetition ratios with their spread; a spread
// wider than 25 % of the median is marked "unstable".
//
// --bundles: per size and bundle size k, bundles of k members of that size
// (views of one buffer, as a pool's blocks), against ucx_perftest moving the
// same members and against the same bytes as one tensor (k times the size),
// interleaved; `window` bundles in flight.
//
// --trusted: both nodes trust their peers (remote_node_options::
// trusted_peers), so importers read by RMA get where UCX has a lane of its
// own (cma over shared memory) for imports of at least 16 MiB
// (min_rma_bytes); --fetch=rma reads every import so. The exporter keeps
// each buffer it publishes from registered (remote_node::register_memory),
// so re-publishing registers nothing; --trusted=unregistered lets each
// publication register its own memory instead.
//
// --strided: every-other-row tensors whose rows are 1 KiB to 256 KiB,
// sent by the exporter run by run against as a compact copy it gathers (the
// exporter's remote_node_options::min_run_bytes); with --trusted, read by
// RMA run by run against as their span (the importer's), to find where runs
// start to pay.
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "dlasync/dlasync.hpp"
#include "dlasync/remote.hpp"

extern char** environ;  // NOLINT(readability-redundant-declaration): POSIX's

namespace {

using namespace dlasync;
using clock_type = std::chrono::steady_clock;

std::string hex(std::string_view bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (char c : bytes) {
    out += digits[static_cast<unsigned char>(c) >> 4];
    out += digits[static_cast<unsigned char>(c) & 15];
  }
  return out;
}

std::string unhex(std::string_view h) {
  auto v = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2)
    out += static_cast<char>(v(h[i]) * 16 + v(h[i + 1]));
  return out;
}

// ---- the exporter ----------------------------------------------------------

// A publication's encoding as a line of `out`; false (and the error said)
// when it was refused.
template <typename Published>
bool add_line(std::string& out, const absl::StatusOr<Published>& r) {
  if (!r.ok()) {
    std::cout << "error " << r.status() << std::endl;
    return false;
  }
  out += hex(r->encode());
  out += '\n';
  return true;
}

int serve(const std::string& transports, const std::string& trust) {
  runtime_options ro;
  ro.worker_threads = 1;
  ro.cuda = "off";
  auto rt = runtime::create(ro);
  if (!rt.ok()) return 1;
  remote_node_options no;
  no.transports = transports;
  no.trusted_peers = !trust.empty();
  auto node = remote_node::create(**rt, no);
  if (!node.ok()) {
    std::cout << "error " << node.status() << std::endl;
    return 1;
  }
  std::vector<std::shared_ptr<std::vector<unsigned char>>> buffers;
  std::vector<remote_registration> registered;
  // A new buffer, kept registered when the exporter registers its memory.
  auto buffer = [&](std::size_t bytes) {
    auto memory = std::make_shared<std::vector<unsigned char>>(bytes, 0x5a);
    buffers.push_back(memory);
    if (trust == "registered") {
      absl::StatusOr<remote_registration> r = (*node)->register_memory(memory->data(), bytes);
      if (!r.ok()) {
        std::cerr << "register_memory: " << r.status() << "\n";
        std::exit(1);
      }
      registered.push_back(*std::move(r));
    }
    return memory;
  };
  std::cout << "ready" << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string command;
    in >> command;
    if (command == "publish") {
      // publish <rows> <row bytes> <row stride bytes> <count>
      std::int64_t rows = 0, row = 0, stride = 0, count = 0;
      in >> rows >> row >> stride >> count;
      auto memory = buffer(static_cast<std::size_t>(rows * stride));
      std::string out;
      for (std::int64_t i = 0; i < count; ++i) {
        tensor_description d;
        d.data = memory->data();
        d.dtype = dtypes::uint8;
        d.shape = {rows, row};
        d.strides = std::vector<std::int64_t>{stride, 1};
        managed_tensor t = make_managed_tensor(std::move(d), [memory] {});
        if (!add_line(out, (*node)->publish(t))) return 1;
      }
      std::cout << out << std::flush;
    } else if (command == "publish_bundle") {
      // publish_bundle <member bytes> <members> <count>: members side by
      // side in one buffer
      std::int64_t bytes = 0, members = 0, count = 0;
      in >> bytes >> members >> count;
      auto memory = buffer(static_cast<std::size_t>(bytes * members));
      std::string out;
      for (std::int64_t i = 0; i < count; ++i) {
        std::vector<managed_tensor> sources;
        for (std::int64_t k = 0; k < members; ++k) {
          tensor_description d;
          d.data = memory->data() + k * bytes;
          d.dtype = dtypes::uint8;
          d.shape = {bytes};
          sources.push_back(make_managed_tensor(std::move(d), [memory] {}));
        }
        if (!add_line(out, (*node)->publish_bundle(sources))) return 1;
      }
      std::cout << out << std::flush;
    } else if (command == "min_run") {
      // min_run <bytes>: a node of its own, whose exporter sends runs of
      // at least that many bytes one by one, and a gathered copy below.
      no.min_run_bytes = 0;
      in >> no.min_run_bytes;
      registered.clear();
      node->reset();  // a runtime has one node at a time
      node = remote_node::create(**rt, no);
      if (!node.ok()) {
        std::cout << "error " << node.status() << std::endl;
        return 1;
      }
      std::cout << "ready" << std::endl;
    } else if (command == "quit") {
      break;
    }
  }
  registered.clear();
  (*node)->shutdown();
  return 0;
}

// ---- processes -------------------------------------------------------------

struct child {
  pid_t pid = -1;
  int in = -1;
  int out = -1;
  std::string buffer;

  std::optional<std::string> line(std::chrono::seconds timeout = std::chrono::seconds(120)) {
    const auto until = clock_type::now() + timeout;
    for (;;) {
      const std::size_t nl = buffer.find('\n');
      if (nl != std::string::npos) {
        std::string l = buffer.substr(0, nl);
        buffer.erase(0, nl + 1);
        return l;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(until - clock_type::now()).count();
      if (left <= 0) return std::nullopt;
      pollfd p{out, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char chunk[1 << 16];
      const ssize_t n = read(out, chunk, sizeof(chunk));
      if (n <= 0) return std::nullopt;
      buffer.append(chunk, static_cast<std::size_t>(n));
    }
  }
  void send(const std::string& l) {
    const std::string s = l + "\n";
    if (write(in, s.data(), s.size()) < 0) std::perror("write");
  }
  int wait() {
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    pid = -1;
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    in = out = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

child spawn(const std::vector<std::string>& args, const std::vector<std::string>& extra_env) {
  std::vector<std::string> a = args;
  std::vector<char*> argv;
  argv.reserve(a.size() + 1);
  for (std::string& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env;
  for (char** e = ::environ; *e != nullptr; ++e) env.emplace_back(*e);
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> envp;
  envp.reserve(env.size() + 1);
  for (std::string& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  int in[2];
  int out[2];
  child c;
  if (pipe(in) != 0 || pipe(out) != 0) return c;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, in[1]);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  if (posix_spawnp(&c.pid, argv[0], &fa, nullptr, argv.data(), envp.data()) != 0) c.pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  c.in = in[1];
  c.out = out[0];
  return c;
}

// One ucx_perftest client run against a fresh server: bytes per second, or
// 0 when it could not run.
double perftest(const std::string& transports, const std::string& test, std::uint64_t size,
                std::uint64_t n, int port) {
  const std::vector<std::string> env = {"UCX_TLS=" + transports};
  child server = spawn({"ucx_perftest", "-p", std::to_string(port)}, env);
  if (server.pid < 0) return 0;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  child client = spawn({"ucx_perftest", "127.0.0.1", "-p", std::to_string(port), "-t", test, "-s",
                        std::to_string(size), "-n", std::to_string(n), "-w", "2", "-f", "-v"},
                       env);
  double bw = 0;
  while (std::optional<std::string> l = client.line(std::chrono::seconds(60))) {
    // "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,..."
    if (l->empty() || (*l)[0] == 'i' || l->find(',') == std::string::npos) continue;
    std::vector<std::string> cols;
    std::stringstream ss(*l);
    for (std::string c; std::getline(ss, c, ',');) cols.push_back(c);
    if (cols.size() >= 6) bw = std::atof(cols[5].c_str()) * 1024.0 * 1024.0;  // MB/s, MB = 2^20
  }
  kill(client.pid, SIGKILL);  // done, or stuck: either way it ends here
  client.wait();
  kill(server.pid, SIGKILL);
  server.wait();
  return bw;
}

void start_import(remote_node& node, const remote_descriptor& d,
                  absl::AnyInvocable<void(const absl::Status&)> done) {
  async_import_remote(
      node, d, {},
      [done = std::move(done)](const absl::StatusOr<tensor>& t) mutable { done(t.status()); });
}

void start_import(remote_node& node, const remote_bundle& b,
                  absl::AnyInvocable<void(const absl::Status&)> done) {
  async_import_remote_bundle(
      node, b, {}, [done = std::move(done)](const absl::StatusOr<std::vector<tensor>>& t) mutable {
        done(t.status());
      });
}

// Imports every descriptor (or bundle) with `window` in flight: bytes per
// second.
template <typename Item>
double import_all(remote_node& node, const std::vector<Item>& ds, std::size_t window,
                  std::uint64_t bytes_each, bool& failed) {
  std::mutex m;
  std::condition_variable cv;
  std::size_t next = 0;
  std::size_t done = 0;
  std::size_t in_flight = 0;
  const auto start = clock_type::now();
  std::unique_lock lock(m);
  while (done < ds.size()) {
    while (in_flight < window && next < ds.size()) {
      ++in_flight;
      const Item& d = ds[next++];
      lock.unlock();
      start_import(node, d, [&](const absl::Status& s) {
        if (!s.ok()) {
          std::cerr << "import failed: " << s << "\n";
          failed = true;
        }
        std::lock_guard g(m);
        --in_flight;
        ++done;
        cv.notify_one();
      });
      lock.lock();
    }
    // With a predicate: the last completions may all come while this thread
    // is submitting, and then no notification is left to wait for.
    cv.wait(lock, [&] { return done == ds.size() || (in_flight < window && next < ds.size()); });
  }
  const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  return static_cast<double>(bytes_each) * static_cast<double>(ds.size()) / seconds;
}

// `count` encodings the exporter printed, decoded; none when it stopped.
template <typename Published>
std::optional<std::vector<Published>> read_published(child& exporter, std::uint64_t count) {
  std::vector<Published> out;
  out.reserve(count);
  for (std::uint64_t i = 0; i < count; ++i) {
    std::optional<std::string> l = exporter.line();
    if (!l) return std::nullopt;
    absl::StatusOr<Published> p = Published::decode(unhex(*l));
    if (!p.ok()) return std::nullopt;
    out.push_back(*std::move(p));
  }
  return out;
}

struct row_result {
  std::vector<double> base, ours, ratio;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// "median [min-max]", marked unstable when the spread is wider than 25 %
// of the median.
std::string spread(const std::vector<double>& ratios) {
  const double med = median(ratios);
  const double lo = ratios.empty() ? 0 : *std::min_element(ratios.begin(), ratios.end());
  const double hi = ratios.empty() ? 0 : *std::max_element(ratios.begin(), ratios.end());
  char text[64];
  std::snprintf(text, sizeof(text), "%.2f [%.2f-%.2f]%s", med, lo, hi,
                (hi - lo) > 0.25 * med ? " unstable" : "");
  return text;
}

std::string size_name(std::uint64_t b) {
  if (b >= (1u << 20)) return std::to_string(b >> 20) + " MiB";
  if (b >= 1024) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

std::vector<std::uint64_t> parse_list(const std::string& s) {
  std::vector<std::uint64_t> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(std::stoull(x));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> transports = {"shm", "tcp"};
  std::vector<std::uint64_t> sizes = {65536, 1 << 20, 16 << 20, 256 << 20};
  int reps = 5;
  std::uint64_t bytes_per_rep = 256ull << 20;
  std::size_t window = 4;
  bool strided = false;
  std::vector<std::uint64_t> bundles;
  remote_fetch fetch = remote_fetch::automatic;
  std::string trust;  // "", "registered" or "unregistered"
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> std::optional<std::string> {
      const std::string p = std::string(name) + "=";
      if (a.rfind(p, 0) == 0) return a.substr(p.size());
      return std::nullopt;
    };
    if (auto v = value("--trust")) trust = *v;
    if (auto v = value("--serve")) return serve(*v, trust);
    if (auto v = value("--transports")) {
      transports.clear();
      std::stringstream ss(*v);
      for (std::string t; std::getline(ss, t, ',');) transports.push_back(t);
    } else if (auto v = value("--sizes")) {
      sizes = parse_list(*v);
    } else if (auto v = value("--reps")) {
      reps = std::stoi(*v);
    } else if (auto v = value("--bytes_per_rep")) {
      bytes_per_rep = std::stoull(*v);
    } else if (auto v = value("--window")) {
      window = std::stoul(*v);
    } else if (auto v = value("--bundles")) {
      bundles = parse_list(*v);
    } else if (a == "--trusted" || a == "--trusted=unregistered") {
      trust = a == "--trusted" ? "registered" : "unregistered";
    } else if (a.rfind("--trust=", 0) == 0) {
      // the exporter's own option, given before --serve
    } else if (a == "--strided") {
      strided = true;
    } else if (auto v = value("--fetch")) {
      if (*v == "rma") fetch = remote_fetch::rma;
      if (*v == "am") fetch = remote_fetch::active_messages;
    } else {
      std::cerr << "unknown option " << a << "\n";
      return 2;
    }
  }
  const std::string self = argv[0];
  bool failed = false;
  int port = 13400 + static_cast<int>(getpid() % 500);

  std::cout << "remote ratio table: dlasync remote imports (hold, bytes, release, each into new "
               "budgeted host memory) against ucx_perftest on the same transport and sizes, "
               "interleaved; medians of "
            << reps << " repetitions, window " << window
            << (trust.empty() ? std::string()
                              : ", trusted peers (RMA where UCX has a lane; " + trust + " memory)")
            << "\n";
  std::printf("%-4s %-9s %-10s %8s %12s %12s %24s\n", "tls", "size", "perftest", "count",
              "perftest GB/s", "dlasync GB/s", "ratio median [min-max]");
  for (const std::string& tls : transports) {
    child exporter = spawn({self, "--trust=" + trust, "--serve=" + tls}, {});
    if (exporter.line() != std::optional<std::string>("ready")) {
      std::cerr << "the exporter did not start\n";
      return 1;
    }
    runtime_options ro;
    ro.worker_threads = 2;
    ro.cuda = "off";
    auto rt = runtime::create(ro);
    remote_node_options no;
    no.transports = tls;
    no.fetch = fetch;
    no.trusted_peers = !trust.empty();
    auto node = remote_node::create(**rt, no);
    if (!node.ok()) {
      std::cerr << node.status() << "\n";
      return 1;
    }
    const std::string test = tls == "tcp" ? "ucp_am_bw" : "ucp_get";
    for (std::uint64_t size : sizes) {
      const std::uint64_t n = std::clamp<std::uint64_t>(bytes_per_rep / size, 4, 2000);
      row_result r;
      for (int rep = 0; rep < reps; ++rep) {
        const double base = perftest(tls, test, size, n, port++);
        exporter.send("publish 1 " + std::to_string(size) + " " + std::to_string(size) + " " +
                      std::to_string(n));
        std::optional<std::vector<remote_descriptor>> ds =
            read_published<remote_descriptor>(exporter, n);
        if (!ds) return 1;
        const double ours = import_all(**node, *ds, window, size, failed);
        r.base.push_back(base);
        r.ours.push_back(ours);
        if (base > 0) r.ratio.push_back(ours / base);
      }
      std::printf("%-4s %-9s %-10s %8llu %12.2f %12.2f %24s\n", tls.c_str(),
                  size_name(size).c_str(), test.c_str(), static_cast<unsigned long long>(n),
                  median(r.base) / 1e9, median(r.ours) / 1e9, spread(r.ratio).c_str());
      std::fflush(stdout);
    }
    if (!bundles.empty()) {
      std::printf(
          "\nbundles (%s): k members of one size in one bundle; perftest moves the same members "
          "(%s), one tensor the same bytes (k times the size); ratios are medians over the "
          "repetitions\n",
          tls.c_str(), test.c_str());
      std::printf("%-9s %5s %8s %13s %12s %12s %16s %16s\n", "member", "k", "bundles",
                  "perftest GB/s", "bundle GB/s", "tensor GB/s", "bundle/perftest",
                  "bundle/tensor");
      for (std::uint64_t size : sizes) {
        for (std::uint64_t k : bundles) {
          const std::uint64_t count =
              std::clamp<std::uint64_t>(bytes_per_rep / (size * k), 2, 2000);
          std::vector<double> base, ours, whole, vs_base, vs_whole;
          for (int rep = 0; rep < reps; ++rep) {
            const double b = perftest(tls, test, size, count * k, port++);
            exporter.send("publish_bundle " + std::to_string(size) + " " + std::to_string(k) + " " +
                          std::to_string(count));
            std::optional<std::vector<remote_bundle>> bs =
                read_published<remote_bundle>(exporter, count);
            if (!bs) return 1;
            const double o = import_all(**node, *bs, window, size * k, failed);
            exporter.send("publish 1 " + std::to_string(size * k) + " " + std::to_string(size * k) +
                          " " + std::to_string(count));
            std::optional<std::vector<remote_descriptor>> ds =
                read_published<remote_descriptor>(exporter, count);
            if (!ds) return 1;
            const double w = import_all(**node, *ds, window, size * k, failed);
            base.push_back(b);
            ours.push_back(o);
            whole.push_back(w);
            if (b > 0) vs_base.push_back(o / b);
            if (w > 0) vs_whole.push_back(o / w);
          }
          std::printf("%-9s %5llu %8llu %13.2f %12.2f %12.2f %16s %16s\n", size_name(size).c_str(),
                      static_cast<unsigned long long>(k), static_cast<unsigned long long>(count),
                      median(base) / 1e9, median(ours) / 1e9, median(whole) / 1e9,
                      spread(vs_base).c_str(), spread(vs_whole).c_str());
          std::fflush(stdout);
        }
      }
    }
    if (strided) {
      // Who chooses: the importer, for its RMA gets (runs, or the span
      // compacted here); else the exporter, for the pieces it sends (runs,
      // or a compact copy it gathers).
      const bool by_rma = !trust.empty();
      std::printf(
          by_rma ? "\nstrided (%s): every other row, 16 MiB of rows, read by RMA; runs = one get "
                   "per row, span = the whole span then compacted here\n"
                 : "\nstrided (%s): every other row, 16 MiB of rows, sent by the exporter; runs "
                   "= one piece per row, gathered = the exporter's compact copy\n",
          tls.c_str());
      std::printf("%-9s %12s %12s %10s\n", "row", "runs GB/s",
                  by_rma ? "span GB/s" : "gathered GB/s", by_rma ? "runs/span" : "runs/gath");
      for (std::uint64_t row : {1024ull, 4096ull, 16384ull, 65536ull, 131072ull, 262144ull}) {
        const std::uint64_t rows = (16ull << 20) / row;
        std::vector<double> runs, span;
        for (int rep = 0; rep < reps; ++rep) {
          for (bool by_runs : {true, false}) {
            const std::uint64_t min_run = by_runs ? 1 : (1ull << 62);
            remote_node_options so = no;
            if (by_rma) so.min_run_bytes = min_run;
            node->reset();  // a runtime has one node at a time
            node = remote_node::create(**rt, so);
            if (!by_rma) {
              exporter.send("min_run " + std::to_string(min_run));
              if (exporter.line() != std::optional<std::string>("ready")) {
                std::cerr << "the exporter did not take min_run\n";
                return 1;
              }
            }
            exporter.send("publish " + std::to_string(rows) + " " + std::to_string(row) + " " +
                          std::to_string(2 * row) + " 4");
            std::vector<remote_descriptor> ds;
            ds.reserve(4);
            for (int i = 0; i < 4; ++i)
              ds.push_back(*remote_descriptor::decode(unhex(*exporter.line())));
            (by_runs ? runs : span).push_back(import_all(**node, ds, 1, rows * row, failed));
          }
        }
        std::printf("%-9s %12.2f %12.2f %10.2f\n", size_name(row).c_str(), median(runs) / 1e9,
                    median(span) / 1e9, median(runs) / median(span));
      }
    }
    exporter.send("quit");
    exporter.wait();
    // Which way the imports went (what automatic chose).
    const remote_import_counts done = (*node)->imports_completed();
    std::printf("\n%s imports: %llu read by RMA, %llu sent by the exporter\n", tls.c_str(),
                static_cast<unsigned long long>(done.read_by_rma),
                static_cast<unsigned long long>(done.sent_by_exporter));
    (*node)->shutdown();
  }
  return failed ? 1 : 0;
}
