#include "dlasync/device_registry.hpp"

#include <charconv>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/src/status_macros.hpp"

namespace dlasync {
namespace {

struct launcher {
  const char* name;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

constexpr launcher launchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

absl::Status bad_variable(const char* name, absl::string_view value, absl::string_view want) {
  return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, "=\"", value,
                                                 "\" is not ", want, "; fix or unset it"));
}

// Parses a whole decimal integer in [min, max].
absl::StatusOr<int> parse_int(const char* name, absl::string_view text, int min, int max) {
  int value = 0;
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  const auto [end, ec] = std::from_chars(trimmed.data(), trimmed.data() + trimmed.size(), value);
  if (trimmed.empty() || ec != std::errc() || end != trimmed.data() + trimmed.size() ||
      value < min || value > max) {
    return bad_variable(name, text, absl::StrCat("an integer in [", min, ", ", max, "]"));
  }
  return value;
}

// Reads `name` into `field` when it is set.
absl::Status read_int(const process_topology::env_lookup& lookup, const char* name, int min,
                      int max, int& field, bool& found) {
  const char* text = lookup(name);
  if (text == nullptr) return absl::OkStatus();
  absl::StatusOr<int> value = parse_int(name, text, min, max);
  if (!value.ok()) return value.status();
  field = *value;
  found = true;
  return absl::OkStatus();
}

// Slurm's SLURM_TASKS_PER_NODE lists tasks per node compressed, "2(x3),1":
// returns the count for node `node`.
absl::StatusOr<int> slurm_tasks_on_node(absl::string_view list, int node) {
  int index = 0;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    int count = 0;
    int repeat = 1;
    absl::string_view head = part;
    if (const auto open = part.find("(x"); open != absl::string_view::npos) {
      head = part.substr(0, open);
      absl::string_view times = part.substr(open + 2);
      if (!absl::ConsumeSuffix(&times, ")") || !absl::SimpleAtoi(times, &repeat) || repeat < 1) {
        return bad_variable("SLURM_TASKS_PER_NODE", list, "a Slurm task list like \"2(x3),1\"");
      }
    }
    if (!absl::SimpleAtoi(head, &count) || count < 1) {
      return bad_variable("SLURM_TASKS_PER_NODE", list, "a Slurm task list like \"2(x3),1\"");
    }
    if (node < index + repeat) return count;
    index += repeat;
  }
  return bad_variable("SLURM_TASKS_PER_NODE", list,
                      absl::StrCat("a task list covering node ", node, " (SLURM_NODEID)"));
}

absl::Status read_launcher(const process_topology::env_lookup& lookup, const launcher& l,
                           process_topology& t, bool& found) {
  constexpr int max_ranks = 1 << 24;
  bool rank_found = false;
  bool size_found = false;
  DLASYNC_RETURN_IF_ERROR(read_int(lookup, l.rank, 0, max_ranks, t.rank, rank_found));
  DLASYNC_RETURN_IF_ERROR(read_int(lookup, l.world_size, 1, max_ranks, t.world_size, size_found));
  if (!rank_found && !size_found) return absl::OkStatus();
  found = true;
  // Without local variables, the job is taken to run on one node.
  t.local_rank = t.rank;
  t.local_world_size = t.world_size;
  bool ignored = false;
  DLASYNC_RETURN_IF_ERROR(read_int(lookup, l.local_rank, 0, max_ranks, t.local_rank, ignored));
  const char* local_size = lookup(l.local_world_size);
  if (local_size != nullptr) {
    absl::StatusOr<int> parsed = parse_int(l.local_world_size, local_size, 1, max_ranks);
    if (!parsed.ok()) return parsed.status();
    t.local_world_size = *parsed;
  } else if (absl::string_view(l.name) == "Slurm" && lookup("SLURM_TASKS_PER_NODE") != nullptr) {
    int node = 0;
    DLASYNC_RETURN_IF_ERROR(read_int(lookup, "SLURM_NODEID", 0, max_ranks, node, ignored));
    absl::StatusOr<int> count = slurm_tasks_on_node(lookup("SLURM_TASKS_PER_NODE"), node);
    if (!count.ok()) return count.status();
    t.local_world_size = *count;
  }
  t.source = l.name;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> parse_ordinals(const char* name, absl::string_view text) {
  std::vector<int> ordinals;
  if (absl::StripAsciiWhitespace(text).empty()) return ordinals;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    absl::StatusOr<int> ordinal = parse_int(name, part, 0, 1 << 16);
    if (!ordinal.ok()) {
      return bad_variable(name, text, "a comma-separated list of CUDA ordinals like \"0,2\"");
    }
    ordinals.push_back(*ordinal);
  }
  return ordinals;
}

}  // namespace

process_topology process_topology::single_process(int host_devices) {
  process_topology t;
  t.host_device_count = host_devices;
  t.source = "code";
  return t;
}

absl::StatusOr<process_topology> process_topology::from_environment() {
  return from_environment([](const char* name) -> const char* { return std::getenv(name); });
}

absl::StatusOr<process_topology> process_topology::from_environment(const env_lookup& lookup) {
  process_topology t;
  for (const launcher& l : launchers) {
    bool found = false;
    DLASYNC_RETURN_IF_ERROR(read_launcher(lookup, l, t, found));
    if (found) break;
  }
  constexpr int max_ranks = 1 << 24;
  bool overridden = false;
  DLASYNC_RETURN_IF_ERROR(read_int(lookup, "DLASYNC_RANK", 0, max_ranks, t.rank, overridden));
  DLASYNC_RETURN_IF_ERROR(
      read_int(lookup, "DLASYNC_WORLD_SIZE", 1, max_ranks, t.world_size, overridden));
  DLASYNC_RETURN_IF_ERROR(
      read_int(lookup, "DLASYNC_LOCAL_RANK", 0, max_ranks, t.local_rank, overridden));
  DLASYNC_RETURN_IF_ERROR(
      read_int(lookup, "DLASYNC_LOCAL_WORLD_SIZE", 1, max_ranks, t.local_world_size, overridden));
  DLASYNC_RETURN_IF_ERROR(read_int(lookup, "DLASYNC_HOST_DEVICES", 1, max_host_devices,
                                   t.host_device_count, overridden));
  int per_node = 0;
  bool per_node_found = false;
  DLASYNC_RETURN_IF_ERROR(
      read_int(lookup, "DLASYNC_CUDA_DEVICES_PER_NODE", 0, 1 << 16, per_node, per_node_found));
  if (per_node_found) t.cuda_devices_per_node = per_node;
  if (const char* list = lookup("DLASYNC_CUDA_DEVICES"); list != nullptr) {
    absl::StatusOr<std::vector<int>> ordinals = parse_ordinals("DLASYNC_CUDA_DEVICES", list);
    if (!ordinals.ok()) return ordinals.status();
    t.cuda_ordinals = *std::move(ordinals);
    overridden = true;
  }
  overridden = overridden || per_node_found;
  if (overridden) {
    t.source = t.source == "default" ? "DLASYNC_*" : absl::StrCat(t.source, " + DLASYNC_*");
  }
  DLASYNC_RETURN_IF_ERROR(t.check());
  return t;
}

absl::Status process_topology::check() const {
  auto bad = [this](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("inconsistent process topology (", source, "): ", what));
  };
  if (world_size < 1) return bad(absl::StrCat("world size ", world_size, " is below 1"));
  if (rank < 0 || rank >= world_size) {
    return bad(absl::StrCat("rank ", rank, " is outside [0, ", world_size, ")"));
  }
  if (local_world_size < 1 || local_world_size > world_size) {
    return bad(
        absl::StrCat("local world size ", local_world_size, " is outside [1, ", world_size, "]"));
  }
  if (local_rank < 0 || local_rank >= local_world_size) {
    return bad(absl::StrCat("local rank ", local_rank, " is outside [0, ", local_world_size, ")"));
  }
  if (local_rank > rank) {
    return bad(absl::StrCat("local rank ", local_rank, " is above rank ", rank,
                            "; ranks must be laid out node by node"));
  }
  if (host_device_count < 1 || host_device_count > max_host_devices) {
    return bad(absl::StrCat("host device count ", host_device_count, " is outside [1, ",
                            max_host_devices, "]"));
  }
  if (cuda_devices_per_node && *cuda_devices_per_node < 0) {
    return bad(absl::StrCat("CUDA device count ", *cuda_devices_per_node, " is negative"));
  }
  if (cuda_ordinals) {
    for (int ordinal : *cuda_ordinals) {
      if (ordinal < 0 || (cuda_devices_per_node && ordinal >= *cuda_devices_per_node)) {
        return bad(absl::StrCat("owned CUDA ordinal ", ordinal, " is not a device of this node"));
      }
    }
  }
  return absl::OkStatus();
}

bool process_topology::owns_cuda_ordinal(int ordinal) const {
  if (ordinal < 0) return false;
  if (cuda_ordinals) {
    for (int owned : *cuda_ordinals) {
      if (owned == ordinal) return true;
    }
    return false;
  }
  return ordinal % local_world_size == local_rank;
}

std::optional<int> process_topology::cuda_owner_rank(int ordinal) const {
  if (ordinal < 0) return std::nullopt;
  if (cuda_ordinals) {
    if (owns_cuda_ordinal(ordinal)) return rank;
    return std::nullopt;
  }
  return rank - local_rank + ordinal % local_world_size;
}

std::string process_topology::describe() const {
  return absl::StrCat("rank ", rank, " of ", world_size, " (local rank ", local_rank, " of ",
                      local_world_size, ", from ", source, ")");
}

}  // namespace dlasync
