// The one byte-size parser and formatter, and the one duration formatter, of the program (issue 12): `plan --device-memory`,
// `device_memory` in the config, `bench comm --min-bytes/--max-bytes` and every printed size go
// through it, so "4KB" means the same everywhere (it used to be 4000 bytes in `plan` and 4096 in
// `bench comm`).
// Convention (SI and IEC, as the Hugging Face and DeepSpeed docs and `ls --si`/`ls -h` read them):
//   K, KB = 1e3, M, MB = 1e6, G, GB = 1e9, T, TB = 1e12;  Ki, KiB = 1024, Mi, MiB = 2^20, Gi, GiB = 2^30,
//   Ti, TiB = 2^40; a bare number is bytes and may be written in any JSON form (2e8, 4096, 1.5).
//   Units are case-insensitive ("4kb" = "4KB"); spaces between number and unit are allowed.
#pragma once
#include <cstdint>
#include <string>

namespace shardlm::util {

// Bytes in `text`; throws shardlm::Error with examples for anything else (negative, NaN, unknown unit).
double parse_bytes(const std::string& text);

// "512 B", exact binary multiples as "4 KiB" / "256 MiB" / "2 GiB", anything else in SI units with
// one decimal: "1.2 MB", "32.0 GB". What it prints parses back to the same bytes (to the decimal shown).
std::string format_bytes(double bytes);

// The one duration formatter: "850 ms", "2.35 s", "1m02s", "3h05m" ("?" when not finite).
std::string format_duration(double seconds);

}  // namespace shardlm::util
