// The other process of the remote-import tests: a runtime with a remote
// node, driven by lines on stdin, answering on stdout.
//
//   publish <code>:<bits>:<lanes> <layout> <shape> <importers> <lease_ms> <seed>
//       -> "descriptor <hex>" | "error <code> <message>"
//   publish_many <n> <code>:<bits>:<lanes> <layout> <shape> <lease_ms>
//       -> n lines "descriptor <hex>" (seeds 0..n-1)
//   publish_bundle <code>:<bits>:<lanes> <layout>:<shape>[,<layout>:<shape>...]
//                  <importers> <lease_ms> <seed>
//       -> "bundle <hex>" (member i laid out with seed + i) | "error <code> <message>"
//   deleted        -> "deleted <producer deleters run so far>"
//   publications   -> "publications <n>"
//   import <hex>   -> "started", later "imported ok" | "imported <code> <message>"
//   import <hex> <code>:<bits>:<lanes> <layout> <shape> <seed>
//                  -> the same, and an import's bytes are checked against the
//                     pattern publish laid out: "imported ok verified" or
//                     "imported mismatch at byte <b>"
//   import_bundle <hex> [<code>:<bits>:<lanes> <layout>:<shape>,... <seed>]
//                  -> "started", later "imported ok" | "imported <code> <message>",
//                     or with the members' layouts, each member's bytes checked
//                     as publish_bundle laid them out: "imported ok verified" or
//                     "imported mismatch in member <i> at byte <b>"
//   secret <bytes> -> "secret <address>": a buffer of 'S' bytes that is never
//                     published (what a forged descriptor must not reach)
//   quit           -> shuts the node down, "bye <deleted>", exits 0
//
// Options: --transports=<UCX_TLS list>, --listen=<address> (the node's
// listener; 127.0.0.1 by default), --import_timeout_ms=<ms>, --trusted
// (remote_node_options::trusted_peers: publications are read by RMA).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "dlasync/dlasync.hpp"
#include "dlasync/remote.hpp"
#include "remote/remote_support.hpp"

namespace {

using namespace dlasync;

// The answers' stream: stdout as it was when the process started. UCX
// prints its log lines on stdout, which main() points at stderr.
FILE* answers = stdout;
std::mutex out_mutex;
std::atomic<int> deleted{0};
std::vector<unsigned char> secret;

void say(const std::string& line) {
  std::lock_guard lock(out_mutex);
  std::fprintf(answers, "%s\n", line.c_str());
  std::fflush(answers);
}

dtype parse_dtype(const std::string& s) {
  unsigned code = 0;
  unsigned bits = 0;
  unsigned lanes = 0;
  std::sscanf(s.c_str(), "%u:%u:%u", &code, &bits, &lanes);
  return dtype{static_cast<std::uint8_t>(code), static_cast<std::uint8_t>(bits),
               static_cast<std::uint16_t>(lanes)};
}

// A tensor of the pattern, whose deleter counts.
managed_tensor laid_out_tensor(const dtype& type, const std::string& layout,
                               const std::vector<std::int64_t>& shape, unsigned seed) {
  auto memory = std::make_shared<testing::laid_out>(
      testing::lay_out(layout, shape, type.padded_size(), seed));
  tensor_description d;
  d.data = memory->data();
  d.dtype = type;
  d.shape = memory->shape;
  d.strides = memory->strides;
  d.byte_offset = memory->byte_offset;
  return make_managed_tensor(std::move(d), [memory]() mutable {
    memory.reset();
    deleted.fetch_add(1);
  });
}

publish_options lease_of(std::uint32_t importers, long lease_ms) {
  publish_options o;
  o.importers = importers;
  o.lease = std::chrono::milliseconds(lease_ms);
  return o;
}

// "<word> <code> <message>".
std::string failed(const std::string& word, const absl::Status& s) {
  return word + " " + std::to_string(static_cast<int>(s.code())) + " " + std::string(s.message());
}

template <typename T>
std::string answer(const absl::StatusOr<T>& r, const std::string& what) {
  if (!r.ok()) return failed("error", r.status());
  return what + " " + testing::to_hex(r->encode());
}

std::string publish(remote_node& node, const dtype& type, const std::string& layout,
                    const std::vector<std::int64_t>& shape, std::uint32_t importers, long lease_ms,
                    unsigned seed) {
  managed_tensor t = laid_out_tensor(type, layout, shape, seed);
  return answer(node.publish(t, lease_of(importers, lease_ms)), "descriptor");
}

// Members as "<layout>:<shape>,...".
std::string publish_bundle(remote_node& node, const dtype& type, const std::string& members,
                           std::uint32_t importers, long lease_ms, unsigned seed) {
  std::vector<managed_tensor> sources;
  std::istringstream list(members);
  std::string one;
  while (std::getline(list, one, ',')) {
    const std::size_t colon = one.find(':');
    if (colon == std::string::npos) return "error 3 a member is <layout>:<shape>, not " + one;
    sources.push_back(laid_out_tensor(type, one.substr(0, colon),
                                      testing::parse_shape(one.substr(colon + 1)),
                                      seed + static_cast<unsigned>(sources.size())));
  }
  return answer(node.publish_bundle(sources, lease_of(importers, lease_ms)), "bundle");
}

}  // namespace

int main(int argc, char** argv) {
  answers = fdopen(dup(STDOUT_FILENO), "w");
  dup2(STDERR_FILENO, STDOUT_FILENO);
  remote_node_options options;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--transports=", 0) == 0) options.transports = a.substr(13);
    if (a.rfind("--listen=", 0) == 0) options.listen_address = a.substr(9);
    if (a == "--trusted") options.trusted_peers = true;
    if (a.rfind("--import_timeout_ms=", 0) == 0) {
      options.import_timeout = std::chrono::milliseconds(std::stol(a.substr(20)));
    }
  }
  runtime_options ro;
  ro.worker_threads = 2;
  ro.cuda = "off";
  auto rt = runtime::create(ro);
  if (!rt.ok()) {
    say("error runtime " + std::string(rt.status().message()));
    return 1;
  }
  auto node = remote_node::create(**rt, options);
  if (!node.ok()) {
    say("error node " + std::string(node.status().message()));
    return 1;
  }
  say("ready");
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string command;
    in >> command;
    if (command == "publish") {
      std::string type, layout, shape;
      std::uint32_t importers = 1;
      long lease_ms = 0;
      unsigned seed = 0;
      in >> type >> layout >> shape >> importers >> lease_ms >> seed;
      say(publish(**node, parse_dtype(type), layout, testing::parse_shape(shape), importers,
                  lease_ms, seed));
    } else if (command == "publish_bundle") {
      std::string type, members;
      std::uint32_t importers = 1;
      long lease_ms = 0;
      unsigned seed = 0;
      in >> type >> members >> importers >> lease_ms >> seed;
      say(publish_bundle(**node, parse_dtype(type), members, importers, lease_ms, seed));
    } else if (command == "publish_many") {
      int n = 0;
      std::string type, layout, shape;
      long lease_ms = 0;
      in >> n >> type >> layout >> shape >> lease_ms;
      for (int i = 0; i < n; ++i) {
        say(publish(**node, parse_dtype(type), layout, testing::parse_shape(shape), 1, lease_ms,
                    static_cast<unsigned>(i)));
      }
    } else if (command == "deleted") {
      say("deleted " + std::to_string(deleted.load()));
    } else if (command == "publications") {
      say("publications " + std::to_string((*node)->publications()));
    } else if (command == "import") {
      std::string hex, type, layout, shape;
      unsigned seed = 0;
      in >> hex >> type >> layout >> shape >> seed;
      absl::StatusOr<remote_descriptor> d = remote_descriptor::decode(testing::from_hex(hex));
      if (!d.ok()) {
        say(failed("imported", d.status()));
        continue;
      }
      async_import_remote(**node, *d, {}, [=](const absl::StatusOr<tensor>& t) {
        if (!t.ok()) {
          say(failed("imported", t.status()));
        } else if (layout.empty()) {
          say("imported ok");
        } else {
          // A remote import lands compact, row-major, in host memory.
          const std::optional<std::uint64_t> wrong = testing::first_mismatch(
              static_cast<const unsigned char*>(t->data()), t->byte_size(), layout,
              testing::parse_shape(shape), parse_dtype(type).padded_size(), seed);
          say(wrong ? "imported mismatch at byte " + std::to_string(*wrong)
                    : std::string("imported ok verified"));
        }
      });
      say("started");
    } else if (command == "import_bundle") {
      std::string hex, type, members;
      unsigned seed = 0;
      in >> hex >> type >> members >> seed;
      absl::StatusOr<remote_bundle> b = remote_bundle::decode(testing::from_hex(hex));
      if (!b.ok()) {
        say(failed("imported", b.status()));
        continue;
      }
      // The members' layouts and shapes, to check each one's bytes.
      std::vector<std::pair<std::string, std::string>> layouts;
      std::istringstream list(members);
      for (std::string one; std::getline(list, one, ',');) {
        const std::size_t colon = one.find(':');
        layouts.emplace_back(one.substr(0, colon), one.substr(colon + 1));
      }
      async_import_remote_bundle(**node, *b, {}, [=](const absl::StatusOr<std::vector<tensor>>& t) {
        if (!t.ok()) return say(failed("imported", t.status()));
        if (layouts.empty()) return say("imported ok");
        for (std::size_t i = 0; i < t->size() && i < layouts.size(); ++i) {
          const tensor& m = (*t)[i];
          const std::optional<std::uint64_t> wrong = testing::first_mismatch(
              static_cast<const unsigned char*>(m.data()), m.byte_size(), layouts[i].first,
              testing::parse_shape(layouts[i].second), parse_dtype(type).padded_size(),
              seed + static_cast<unsigned>(i));
          if (wrong) {
            return say("imported mismatch in member " + std::to_string(i) + " at byte " +
                       std::to_string(*wrong));
          }
        }
        say("imported ok verified");
      });
      say("started");
    } else if (command == "secret") {
      std::size_t bytes = 0;
      in >> bytes;
      secret.assign(bytes, 'S');
      say("secret " + std::to_string(reinterpret_cast<std::uintptr_t>(secret.data())));
    } else if (command == "quit") {
      (*node)->shutdown();
      say("bye " + std::to_string(deleted.load()));
      node->reset();
      return 0;
    } else if (!command.empty()) {
      say("error unknown command " + command);
    }
  }
  return 0;
}
