// The few protobuf wire-format writes that TensorBoard's Event records need (varints, fixed-width
// numbers, length-delimited fields). shardlm links no protobuf library: libtorch_cpu.so exports its
// own, and two copies in one process crash (README "Implementation notes", data/tokenizer/spm_isolated.cpp), so
// event files are encoded by hand, field by field, as proto3 serialises them.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace shardlm::observe::pb {

enum Wire : uint32_t { Varint = 0, Fixed64 = 1, Bytes = 2, Fixed32 = 5 };

inline void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

inline void put_tag(std::string& out, uint32_t field, Wire wire) { put_varint(out, (uint64_t{field} << 3) | wire); }

template <typename T>
void put_little_endian(std::string& out, T v) {  // the host is little-endian (x86-64, aarch64)
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}

// A proto3 int64 (negative values as 10-byte two's complement varints).
inline void put_int64(std::string& out, uint32_t field, int64_t v) {
  put_tag(out, field, Varint);
  put_varint(out, static_cast<uint64_t>(v));
}
inline void put_double(std::string& out, uint32_t field, double v) {
  put_tag(out, field, Fixed64);
  put_little_endian(out, v);
}
inline void put_float(std::string& out, uint32_t field, float v) {
  put_tag(out, field, Fixed32);
  put_little_endian(out, v);
}
// A string, bytes or embedded message.
inline void put_bytes(std::string& out, uint32_t field, std::string_view v) {
  put_tag(out, field, Bytes);
  put_varint(out, v.size());
  out.append(v.data(), v.size());
}

}  // namespace shardlm::observe::pb
