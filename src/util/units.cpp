// The one byte-size parser and formatter (units.h).
#include "util/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "util/error.h"

namespace shardlm::util {

double parse_bytes(const std::string& text) {
  const char* examples = "; write bytes as e.g. 2e8, 4096, 500MB, 32GB (K/M/G/T = powers of 1000) or 4KiB, 80GiB "
                         "(Ki/Mi/Gi/Ti = powers of 1024)";
  const char* begin = text.c_str();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(value) || value < 0) fail("cannot read a size from '", text, "'", examples);
  std::string unit(end);
  unit.erase(0, unit.find_first_not_of(" \t"));
  unit.erase(unit.find_last_not_of(" \t") + 1);
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();  // KB = K, KIB = KI
  else if (unit == "B") unit.clear();
  static const char* kPrefixes = "KMGT";
  double mult = 1;
  if (!unit.empty()) {
    const char* at = unit.size() <= 2 ? std::strchr(kPrefixes, unit[0]) : nullptr;
    const bool binary = unit.size() == 2 && unit[1] == 'I';
    if (!at || *at == '\0' || (unit.size() == 2 && !binary)) fail("cannot read a size from '", text, "': unknown unit", examples);
    mult = std::pow(binary ? 1024.0 : 1000.0, static_cast<double>(at - kPrefixes + 1));
  }
  return value * mult;
}

std::string format_bytes(double bytes) {
  char buf[48];
  const double a = std::fabs(bytes);
  if (a < 1000) {
    std::snprintf(buf, sizeof buf, bytes == std::floor(bytes) ? "%.0f B" : "%.1f B", bytes);
    return buf;
  }
  static const char* kBinary[] = {"KiB", "MiB", "GiB", "TiB"};
  static const char* kDecimal[] = {"KB", "MB", "GB", "TB"};
  if (bytes == std::floor(bytes) && std::fmod(a, 1024.0) == 0) {
    int k = 0;
    double v = a / 1024;
    while (k < 3 && std::fmod(v, 1024.0) == 0) v /= 1024, ++k;
    if (v < 1024 || k == 3) {  // "4 KiB", not "4882813 KiB"
      std::snprintf(buf, sizeof buf, "%.0f %s", bytes < 0 ? -v : v, kBinary[k]);
      return buf;
    }
  }
  int k = 0;
  while (k < 3 && a >= std::pow(1000.0, k + 2)) ++k;
  std::snprintf(buf, sizeof buf, "%.1f %s", bytes / std::pow(1000.0, k + 1), kDecimal[k]);
  return buf;
}

std::string format_duration(double s) {
  if (!std::isfinite(s)) return "?";
  if (s < 0) return "-" + format_duration(-s);
  char buf[48];
  if (s < 1) {
    std::snprintf(buf, sizeof buf, "%.3g ms", s * 1e3);
  } else if (s < 100) {
    std::snprintf(buf, sizeof buf, "%.3g s", s);
  } else {
    const long t = std::lround(s);
    if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  }
  return buf;
}

}  // namespace shardlm::util
