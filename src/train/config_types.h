// Why a JSON value cannot become a config field of type T, or "" when it can. It exists because
// JSON numbers carry no type and nlohmann's get<int64_t>() truncates: `steps=2.5` or
// `data.seq_len=32.7` used to train with 2 steps / 32 positions without a word.
#pragma once
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

namespace shardlm::train {

template <typename T>
struct is_vector : std::false_type {};
template <typename T>
struct is_vector<std::vector<T>> : std::true_type {};

template <typename T>
std::string json_type_problem(const nlohmann::json& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v.is_boolean() ? "" : "must be true or false";
  } else if constexpr (std::is_integral_v<T>) {
    // An integral number written as 2e8 or 4.0 is fine; 2.5 is not.
    if (!v.is_number()) return "must be an integer";
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (!std::isfinite(d) || d != std::floor(d)) return "must be an integer";
      if (d < static_cast<double>(std::numeric_limits<T>::lowest()) ||
          d > static_cast<double>(std::numeric_limits<T>::max()))
        return "is out of range for an integer";
    }
    if constexpr (std::is_unsigned_v<T>) {
      if (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0) return "must be >= 0";
      if (v.is_number_float() && v.get<double>() < 0) return "must be >= 0";
    } else {
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<T>::max()))
        return "is out of range for an integer";
      if (v.is_number_integer() && !v.is_number_unsigned() &&
          (v.get<int64_t>() < static_cast<int64_t>(std::numeric_limits<T>::lowest()) ||
           v.get<int64_t>() > static_cast<int64_t>(std::numeric_limits<T>::max())))
        return "is out of range for an integer";
    }
    return "";
  } else if constexpr (std::is_floating_point_v<T>) {
    return v.is_number() ? "" : "must be a number";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return v.is_string() ? "" : "must be a string";
  } else if constexpr (is_vector<T>::value) {
    if (!v.is_array()) return "must be a list";
    for (const auto& e : v) {
      const std::string p = json_type_problem<typename T::value_type>(e);
      if (!p.empty()) return "every element " + p;
    }
    return "";
  } else {
    return "";
  }
}

}  // namespace shardlm::train
