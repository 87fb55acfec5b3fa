#pragma once
// Argument-error messages assembled from strings alone. Where torch is built with a toolchain that
// links parts of libstdc++ into libc10 (gcc-toolset builds: libc10 exports its own
// std::ostringstream members), a number that an extension streams into a TORCH_CHECK message
// crashes the process instead of raising, while strings streamed into it and numbers formatted by
// std::to_string do not (tests/gpu_host/check_extension_errors.py shows each case). relconv's
// checks therefore hand TORCH_CHECK one string, built here; it is built only when a check fails.
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <string>
#include <string_view>
#include <type_traits>

namespace relconv {
namespace message_detail {

inline std::string piece(std::string_view s) { return std::string(s); }
inline std::string piece(const char* s) { return s; }
inline std::string piece(c10::ScalarType t) { return c10::toString(t); }
inline std::string piece(c10::DeviceType t) { return c10::DeviceTypeName(t, /*lower_case=*/true); }
inline std::string piece(const c10::Device& d) { return d.str(); }

template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
std::string piece(T v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, char>) {
    return std::string(1, v);
  } else {
    return std::to_string(v);
  }
}

template <typename T>
std::string piece(c10::ArrayRef<T> values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    out += (i ? ", " : "") + piece(values[i]);
  }
  return out + "]";
}

}  // namespace message_detail

// The pieces of a message concatenated: strings as they are, numbers by std::to_string, dtypes,
// devices and shapes by their names.
template <typename... Args>
std::string message(const Args&... args) {
  std::string out;
  (out += ... += message_detail::piece(args));
  return out;
}

}  // namespace relconv

#define RELCONV_CHECK(cond, ...) TORCH_CHECK(cond, ::relconv::message(__VA_ARGS__))
#define RELCONV_CHECK_VALUE(cond, ...) TORCH_CHECK_VALUE(cond, ::relconv::message(__VA_ARGS__))
