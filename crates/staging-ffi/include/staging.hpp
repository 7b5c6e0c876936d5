// staging.hpp: a small header-only C++17 RAII wrapper over staging_ffi.h, installed beside it.
//
// Every handle is move-only and frees itself; every failing call throws stg::Error with the
// status: opening a load with the library's one-line message and its details, reading the next
// tensor with the message (file, tensor, offset), the other calls with the status's description.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "staging_ffi.h"

namespace stg {

// what(): the library's one-line message, or the status's description where there is none;
// status() the code; details() the longer story, one line each (for STG_BACKEND_UNAVAILABLE
// after a GPU was asked for: each backend passed over and why), often empty.
class Error : public std::runtime_error {
 public:
  Error(stg_status status, const std::string& message, std::string details = {})
      : std::runtime_error(message.empty() ? std::string(stg_status_str(static_cast<uint32_t>(status)))
                                           : message),
        status_(status),
        details_(std::move(details)) {}
  stg_status status() const { return status_; }
  const std::string& details() const { return details_; }

 private:
  stg_status status_;
  std::string details_;
};

namespace detail {
template <typename Handle, typename Fn>
std::string last_error(const Handle* handle, Fn fn) {
  size_t full = 0;
  if (fn(handle, nullptr, 0, &full) != STG_OK || full == 0) return {};
  std::string text(full + 1, '\0');
  size_t written = 0;
  fn(handle, text.data(), text.size(), &written);
  text.resize(written);
  return text;
}
inline void check(stg_status status) {
  if (status != STG_OK) throw Error(status, {});
}
}  // namespace detail

// A device buffer taken from a tensor: the caller owns it now.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(stg_device_buffer* raw) : raw_(raw, &stg_device_buffer_free) {}
  void* ptr() const { return stg_device_buffer_ptr(raw_.get()); }
  size_t size() const { return stg_device_buffer_len(raw_.get()); }

 private:
  std::unique_ptr<stg_device_buffer, void (*)(stg_device_buffer*)> raw_;
};

class Tensor {
 public:
  explicit Tensor(stg_tensor* raw) : raw_(raw, &stg_tensor_free) {}
  stg_tensor_info info() const {
    stg_tensor_info out{};
    detail::check(stg_tensor_describe(raw_.get(), &out));
    return out;
  }
  std::string name() const { return info().name; }
  // The bytes, copied back from wherever they landed (device or host).
  std::vector<uint8_t> to_host() const {
    std::vector<uint8_t> bytes(info().bytes);
    detail::check(stg_tensor_copy_to_host(raw_.get(), bytes.data(), bytes.size()));
    return bytes;
  }
  // Takes the device buffer (device path only); the tensor no longer frees it.
  DeviceBuffer take_device_buffer() {
    stg_device_buffer* out = nullptr;
    detail::check(stg_tensor_take_device_buffer(raw_.get(), &out));
    return DeviceBuffer(out);
  }

 private:
  std::unique_ptr<stg_tensor, void (*)(stg_tensor*)> raw_;
};

class Config {
 public:
  Config() : raw_(nullptr, &stg_config_free) {
    stg_config* out = nullptr;
    detail::check(stg_config_new(&out));
    raw_.reset(out);
  }
  // Any key stg_config_set takes, with its value spelled as `stage --KEY` takes it.
  // A failure throws with the library's message (naming the key and the value).
  Config& option(const std::string& key, const std::string& value) {
    stg_status status = stg_config_set(raw_.get(), key.c_str(), value.c_str());
    if (status != STG_OK) throw Error(status, last_error());
    return *this;
  }
  Config& backend(const std::string& name) { return set(stg_config_set_backend(raw_.get(), name.c_str())); }
  Config& device(uint32_t index) { return set(stg_config_set_device(raw_.get(), index)); }
  Config& threads(uint32_t n) { return set(stg_config_set_threads(raw_.get(), n)); }
  Config& coalesce_below(size_t bytes) { return set(stg_config_set_coalesce_below(raw_.get(), bytes)); }
  Config& chunk_size(size_t bytes) { return set(stg_config_set_chunk_size(raw_.get(), bytes)); }
  Config& device_memory_cap(uint64_t bytes) { return set(stg_config_set_device_memory_cap(raw_.get(), bytes)); }
  // Loads made from this configuration read only what `rank` owns under `plan`.
  Config& plan_rank(const class Plan& plan, size_t rank);
  // The callback returns a region for the tensor, or nullopt to decline. It must outlive every
  // load made from this configuration.
  using Destination = std::function<std::optional<std::pair<void*, size_t>>(const stg_tensor_info&)>;
  Config& destination(Destination* callback) {
    return set(stg_config_set_destination(raw_.get(), &Config::trampoline, callback));
  }
  const stg_config* get() const { return raw_.get(); }
  std::string last_error() const { return detail::last_error(raw_.get(), &stg_config_last_error); }
  std::string last_error_details() const {
    return detail::last_error(raw_.get(), &stg_config_last_error_details);
  }

 private:
  Config& set(stg_status status) {
    detail::check(status);
    return *this;
  }
  static uint32_t trampoline(void* user, const stg_tensor_info* info, void** region, size_t* capacity) {
    try {
      auto answer = (*static_cast<Destination*>(user))(*info);
      if (answer) {
        *region = answer->first;
        *capacity = answer->second;
      }
      return STG_OK;
    } catch (...) {
      return STG_DESTINATION;  // never let an exception cross into the library
    }
  }
  std::unique_ptr<stg_config, void (*)(stg_config*)> raw_;
};

// A partition plan: which rank of a group reads which piece of every tensor (the same on every
// rank; compare fingerprint() to be sure).
class Plan {
 public:
  Plan(const Config& config, const std::string& path, size_t ranks) : raw_(nullptr, &stg_plan_free) {
    stg_plan* out = nullptr;
    stg_status status = stg_plan_new(config.get(), path.c_str(), ranks, &out);
    if (status != STG_OK) throw Error(status, config.last_error(), config.last_error_details());
    raw_.reset(out);
  }
  size_t size() const { return stg_plan_len(raw_.get()); }
  stg_plan_piece piece(size_t index) const {
    stg_plan_piece out{};
    detail::check(stg_plan_get_piece(raw_.get(), index, &out));
    return out;
  }
  uint64_t rank_bytes(size_t rank) const { return stg_plan_rank_bytes(raw_.get(), rank); }
  uint64_t fingerprint() const { return stg_plan_fingerprint(raw_.get()); }
  const stg_plan* get() const { return raw_.get(); }

 private:
  std::unique_ptr<stg_plan, void (*)(stg_plan*)> raw_;
};

class Load {
 public:
  Load(const Config& config, const std::string& path) : raw_(nullptr, &stg_load_free) {
    stg_load* out = nullptr;
    stg_status status = stg_load_new(config.get(), path.c_str(), &out);
    if (status != STG_OK) throw Error(status, config.last_error(), config.last_error_details());
    raw_.reset(out);
  }
  // The next tensor in file order, or nullopt at the end.
  std::optional<Tensor> next() {
    stg_tensor* out = nullptr;
    stg_status status = stg_load_next(raw_.get(), &out);
    if (status == STG_END) return std::nullopt;
    // Freed by another thread meanwhile (stg_load_free): the handle is gone, so no message is
    // read from it, and nothing else may be asked of this Load.
    if (status == STG_LOAD_FREED) throw Error(status, {});
    if (status != STG_OK) throw Error(status, detail::last_error(raw_.get(), &stg_load_last_error));
    return Tensor(out);
  }
  stg_report report() {
    stg_report out{};
    detail::check(stg_load_report(raw_.get(), &out));
    return out;
  }
  std::pair<std::string, std::string> backend() {
    const char* mode = nullptr;
    const char* name = stg_load_backend(raw_.get(), &mode);
    return {name ? name : "", mode ? mode : ""};
  }

 private:
  std::unique_ptr<stg_load, void (*)(stg_load*)> raw_;
};

inline Config& Config::plan_rank(const Plan& plan, size_t rank) {
  return set(stg_config_set_plan_rank(raw_.get(), plan.get(), rank));
}

}  // namespace stg
