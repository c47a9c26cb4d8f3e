// Reading, checking and writing loss-mask sidecars (loss_mask.h). The checks are the point: a mask
// read against the wrong tokens would train silently on prompts or padding.
#include "data/loader/loss_mask.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "data/loader/mapped_file.h"
#include "util/crc32c.h"
#include "util/error.h"

namespace shardlm::data {
namespace {

void put_le(unsigned char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

struct Header {
  int64_t count = 0, row_length = 0;
  bool packed = false;
  uint32_t crc = 0;
};

const char* const kFix = "; write the token file and its mask together with `shardlm prepare --sft`, and copy both";

// One sidecar, checked against its token file `s` and mapped; its bytes become a segment.
Header read_one(const Tokens::Segment& s, LossMasks::Segment* out) {
  const std::string path = sidecar_path(s.source);
  std::shared_ptr<const MappedFile> m = map_whole_file(path, "loss-mask file");
  const unsigned char* h = m->bytes;
  if (m->size < kLossMaskHeaderBytes || static_cast<int32_t>(get_le(h, 4)) != kLossMaskMagic) {
    fail("loss-mask file ", path, " is not a shardlm loss mask (no header with magic ", kLossMaskMagic, ")", kFix);
  }
  if (static_cast<int32_t>(get_le(h + 4, 4)) != kLossMaskVersion) {
    fail("loss-mask file ", path, " has version ", static_cast<int32_t>(get_le(h + 4, 4)), ", this shardlm reads ",
         kLossMaskVersion, kFix);
  }
  Header hd;
  hd.count = static_cast<int64_t>(get_le(h + 8, 8));
  hd.row_length = static_cast<int32_t>(get_le(h + 16, 4));
  hd.packed = get_le(h + 20, 4) != 0;
  hd.crc = static_cast<uint32_t>(get_le(h + 24, 4));
  const uint32_t crc = crc32c_file(s.source);
  if (hd.count != s.size || hd.crc != crc) {
    char got[16], want[16];
    std::snprintf(got, sizeof got, "%08x", crc);
    std::snprintf(want, sizeof want, "%08x", hd.crc);
    fail("loss-mask file ", path, " does not belong to token file ", s.source, ": it was written for ", hd.count,
         " tokens with CRC-32C ", want, ", the token file holds ", s.size, " tokens with CRC-32C ", got, kFix);
  }
  if (hd.row_length < 2 || s.size % hd.row_length != 0) {
    fail("loss-mask file ", path, " says rows of ", hd.row_length, " tokens, but ", s.source, " holds ", s.size,
         " tokens, not whole rows", kFix);
  }
  if (m->size != kLossMaskHeaderBytes + s.size) {
    fail("loss-mask file ", path, " should hold ", kLossMaskHeaderBytes, " + ", s.size, " bytes (one per token of ",
         s.source, ") but holds ", m->size, "; it is truncated or corrupt", kFix);
  }
  const unsigned char* bits = h + kLossMaskHeaderBytes;
  for (int64_t i = 0; i < s.size; ++i) {
    const unsigned char b = bits[i];
    const bool row_start = i % hd.row_length == 0;
    if (b > 3 || (row_start && !(b & kDocumentStart)) || ((b & kDocumentStart) && (b & kCountsInLoss))) {
      fail("loss-mask file ", path, " is corrupt at token ", i, " (byte ", static_cast<int>(b),
           row_start ? ", the first of a row, which must begin a sample" : "",
           "; a sample's first token never counts in the loss)", kFix);
    }
  }
  out->bits = bits;
  out->begin = s.begin;
  out->size = s.size;
  out->storage = std::move(m);
  return hd;
}

}  // namespace

std::string sidecar_path(const std::string& token_path) { return token_path + ".mask"; }

std::shared_ptr<const LossMasks> read_loss_masks(const Tokens& tokens) {
  std::error_code ec;
  std::vector<std::string> with, without;
  for (const auto& s : tokens.segments()) (std::filesystem::exists(sidecar_path(s.source), ec) ? with : without).push_back(s.source);
  if (with.empty()) return nullptr;
  if (!without.empty()) {
    fail("token file ", with[0], " has a loss mask (", sidecar_path(with[0]), ") but ", without[0],
         " of the same data has none; fine-tuning shards each need theirs", kFix);
  }
  auto masks = std::make_shared<LossMasks>();
  masks->source = sidecar_path(tokens.segments()[0].source);
  for (const auto& s : tokens.segments()) {
    masks->segments.emplace_back();
    const Header h = read_one(s, &masks->segments.back());
    if (masks->row_length == 0) {
      masks->row_length = h.row_length;
      masks->packed = h.packed;
    } else if (h.row_length != masks->row_length || h.packed != masks->packed) {
      fail("loss-mask file ", sidecar_path(s.source), " has rows of ", h.row_length, " tokens (",
           h.packed ? "packed" : "padded", "), ", masks->source, " of the same data ", masks->row_length, " (",
           masks->packed ? "packed" : "padded", ")", kFix);
    }
  }
  return masks;
}

const LossMasks::Segment& LossMasks::segment_of(int64_t i) const {
  // The last segment that begins at or before i.
  auto it = std::upper_bound(segments.begin(), segments.end(), i,
                             [](int64_t v, const Segment& s) { return v < s.begin; });
  return *(it - 1);
}

namespace {

// The header of a sidecar of `count` tokens.
void put_header(unsigned char* h, int64_t count, int64_t row_length, bool packed, uint32_t token_crc) {
  std::memset(h, 0, kLossMaskHeaderBytes);
  put_le(h, static_cast<uint32_t>(kLossMaskMagic), 4);
  put_le(h + 4, static_cast<uint32_t>(kLossMaskVersion), 4);
  put_le(h + 8, static_cast<uint64_t>(count), 8);
  put_le(h + 16, static_cast<uint64_t>(row_length), 4);
  put_le(h + 20, packed ? 1 : 0, 4);
  put_le(h + 24, token_crc, 4);
}

}  // namespace

LossMaskWriter::LossMaskWriter(std::string path, int64_t row_length, bool packed)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), row_length_(row_length), packed_(packed) {
  unsigned char h[kLossMaskHeaderBytes];
  put_header(h, 0, row_length_, packed_, 0);  // count and CRC patched by finish()
  file_ = std::fopen(tmp_.c_str(), "wb");
  if (!file_) fail("cannot create ", tmp_, ": ", std::strerror(errno), "; check that the folder is writable");
  if (std::fwrite(h, 1, sizeof h, file_) != sizeof h) {
    std::fclose(file_);
    file_ = nullptr;
    std::remove(tmp_.c_str());
    fail("cannot write ", tmp_, "; check free disk space and rerun");
  }
}

LossMaskWriter::~LossMaskWriter() {
  if (file_) std::fclose(file_);
  if (!committed_) std::remove(tmp_.c_str());
}

void LossMaskWriter::append(const unsigned char* bits, size_t n) {
  if (finished_) fail("loss mask ", path_, " appended to after finish() (internal error)");
  if (std::fwrite(bits, 1, n, file_) != n) fail("cannot write ", tmp_, "; check free disk space and rerun");
  count_ += static_cast<int64_t>(n);
}

void LossMaskWriter::finish(uint32_t token_crc) {
  if (finished_) return;
  unsigned char h[kLossMaskHeaderBytes];
  put_header(h, count_, row_length_, packed_, token_crc);
  const bool ok = std::fseek(file_, 0, SEEK_SET) == 0 && std::fwrite(h, 1, sizeof h, file_) == sizeof h;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  finished_ = true;
  if (!ok || !closed) fail("cannot write ", tmp_, "; check free disk space and rerun");
}

void LossMaskWriter::commit() {
  if (!finished_) fail("loss mask ", path_, " committed before finish() (internal error)");
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec) fail("cannot rename ", tmp_, " to ", path_, ": ", ec.message(), "; check the folder's permissions");
  committed_ = true;
}

}  // namespace shardlm::data
