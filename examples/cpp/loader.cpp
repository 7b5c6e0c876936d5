// loader: loads a safetensors checkpoint through the staging C ABI (`loader --help` says how).
//
// Tensors whose name starts with --prefix go into one caller-owned arena through the destination
// callback (host memory here, so use the host backend; on a GPU the arena would be device memory
// from the caller's allocator); the rest take the library's own paths: --prefix routes, it does
// not filter (--select filters). Prints one line per tensor with an FNV-1a-64 checksum of its
// bytes, then the report. With --rank R --ranks N it plans the checkpoint for a group of N ranks
// and loads only rank R's pieces, as one rank of a tensor-parallel engine would before
// broadcasting them over its own NCCL.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "staging.hpp"

static uint64_t fnv1a(const uint8_t* data, size_t len) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < len; ++i) {
    hash ^= data[i];
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

static const char* path_name(stg_path path) {
  switch (path) {
    case STG_PATH_DESTINATION: return "destination";
    case STG_PATH_DEVICE: return "device";
    case STG_PATH_HOST: return "host";
    case STG_PATH_MAPPED: return "mapped";
  }
  return "?";
}

static const char kUsage[] =
    "usage: loader CHECKPOINT [--prefix P] [--select GLOB] [--arena-bytes N] [--backend NAME]\n"
    "              [--threads N] [--rank R --ranks N]\n"
    "\n"
    "Loads CHECKPOINT (a directory, an index or a .safetensors file) through the staging C ABI and\n"
    "prints one line per tensor (name, path taken, bytes, FNV-1a-64 of its bytes), then the report.\n"
    "\n"
    "  --prefix P         route the tensors whose name starts with P into one caller-owned arena\n"
    "                     (the destination callback). It does not filter: every other tensor still\n"
    "                     loads, on the library's own paths (device or host)\n"
    "  --select GLOB      load only the tensors GLOB matches (repeatable; the option `select`)\n"
    "  --arena-bytes N    the arena's size in bytes (default 67108864); a tensor that does not fit\n"
    "                     is declined and takes the library's paths\n"
    "  --backend NAME     host (default), auto, cufile or hipfile; the arena is host memory, so\n"
    "                     --prefix goes with the host backend\n"
    "  --threads N        I/O threads (default: the library's)\n"
    "  --rank R --ranks N plan the checkpoint for N ranks and load only rank R's pieces\n"
    "  -h, --help         this text\n";

int main(int argc, char** argv) {
  std::string checkpoint, prefix, backend = "host";
  std::vector<std::string> selects;
  size_t arena_bytes = 64 << 20;
  uint32_t threads = 0;
  long rank = -1, ranks = 0;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "-h" || arg == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      }
      if (arg.rfind("-", 0) != 0) {
        if (!checkpoint.empty()) throw std::invalid_argument("a second CHECKPOINT: " + arg);
        checkpoint = arg;
        continue;
      }
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      std::string value = argv[++i];
      if (arg == "--prefix") prefix = value;
      else if (arg == "--select") selects.push_back(value);
      else if (arg == "--arena-bytes") arena_bytes = std::stoull(value);
      else if (arg == "--backend") backend = value;
      else if (arg == "--threads") threads = static_cast<uint32_t>(std::stoul(value));
      else if (arg == "--rank") rank = std::stol(value);
      else if (arg == "--ranks") ranks = std::stol(value);
      else throw std::invalid_argument("unknown option " + arg);
    }
    if (checkpoint.empty()) throw std::invalid_argument("no CHECKPOINT");
  } catch (const std::logic_error& e) {  // invalid_argument, and std::stoul's out_of_range
    std::fprintf(stderr, "loader: %s\n%s", e.what(), kUsage);
    return 2;
  }
  try {
    // One arena, bump-allocated with 256-byte alignment; a tensor that does not fit is declined.
    std::vector<uint8_t> arena(arena_bytes);
    size_t used = 0;
    stg::Config::Destination destination = [&](const stg_tensor_info& info)
        -> std::optional<std::pair<void*, size_t>> {
      if (prefix.empty() || std::strncmp(info.name, prefix.c_str(), prefix.size()) != 0) return std::nullopt;
      size_t start = (used + 255) / 256 * 256;
      if (start + info.bytes > arena.size()) return std::nullopt;
      used = start + info.bytes;
      return std::make_pair(static_cast<void*>(arena.data() + start), info.bytes);
    };
    stg::Config config;
    config.backend(backend).destination(&destination);
    for (const std::string& glob : selects) config.option("select", glob);
    if (threads > 0) config.threads(threads);
    if (ranks > 0) {
      stg::Plan plan(config, checkpoint, static_cast<size_t>(ranks));
      config.plan_rank(plan, static_cast<size_t>(rank));
      size_t owned = 0;
      for (size_t i = 0; i < plan.size(); ++i) owned += plan.piece(i).owner == static_cast<size_t>(rank);
      std::printf("plan rank=%ld of %ld pieces=%zu owned=%zu bytes=%llu fingerprint=%016llx\n", rank, ranks,
                  plan.size(), owned, static_cast<unsigned long long>(plan.rank_bytes(static_cast<size_t>(rank))),
                  static_cast<unsigned long long>(plan.fingerprint()));
    }
    stg::Load load(config, checkpoint);
    bool took = false;
    while (auto tensor = load.next()) {
      stg_tensor_info info = tensor->info();
      uint64_t hash;
      if (info.path == STG_PATH_DESTINATION) {
        hash = fnv1a(static_cast<const uint8_t*>(info.data), info.bytes);
      } else {
        std::vector<uint8_t> bytes = tensor->to_host();
        hash = fnv1a(bytes.data(), bytes.size());
      }
      std::printf("tensor %s %s %zu %016llx\n", info.name, path_name(info.path), info.bytes,
                  static_cast<unsigned long long>(hash));
      if (!took && info.path == STG_PATH_DEVICE && info.bytes > 0) {
        std::string name = info.name;
        stg::DeviceBuffer owned = tensor->take_device_buffer();  // freed when it goes out of scope
        std::printf("took %s %zu\n", name.c_str(), owned.size());
        took = true;
      }
    }
    stg_report r = load.report();
    auto [name, mode] = load.backend();
    std::printf("report tensors=%zu bytes=%llu destination=%zu device=%zu host=%zu backend=%s mode=%s read=%llu\n",
                r.tensors, static_cast<unsigned long long>(r.bytes), r.destination_tensors, r.device_tensors,
                r.host_tensors, name.c_str(), mode.c_str(), static_cast<unsigned long long>(r.bytes_read));
  } catch (const stg::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    if (!e.details().empty()) std::cerr << e.details() << "\n";  // why, in full (no GPU: each backend)
    return 1;
  }
  return 0;
}
