// loader: loads a safetensors checkpoint through the staging C ABI.
//
//   loader CHECKPOINT [--prefix P] [--arena-bytes N] [--backend host|auto|cufile] [--threads N]
//                     [--rank R --ranks N]
//
// Tensors whose name starts with P go into one caller-owned arena through the destination
// callback (host memory here, so use the host backend; on a GPU the arena would be device memory
// from the caller's allocator); the rest take the library's own paths. Prints one line per
// tensor with an FNV-1a-64 checksum of its bytes, then the report. With --rank R --ranks N it
// plans the checkpoint for a group of N ranks and loads only rank R's pieces, as one rank of a
// tensor-parallel engine would before broadcasting them over its own NCCL.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
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
  }
  return "?";
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: loader CHECKPOINT [--prefix P] [--arena-bytes N] [--backend NAME] [--threads N]\n";
    return 2;
  }
  std::string checkpoint = argv[1], prefix, backend = "host";
  size_t arena_bytes = 64 << 20;
  uint32_t threads = 0;
  long rank = -1, ranks = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--prefix") prefix = value;
    else if (flag == "--arena-bytes") arena_bytes = std::stoull(value);
    else if (flag == "--backend") backend = value;
    else if (flag == "--threads") threads = static_cast<uint32_t>(std::stoul(value));
    else if (flag == "--rank") rank = std::stol(value);
    else if (flag == "--ranks") ranks = std::stol(value);
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
    return 1;
  }
  return 0;
}
