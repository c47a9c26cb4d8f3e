// Normalizers, pre-tokenizers and decoders of tokenizer.json (see hf_components.h), each following
// the tokenizers component of the same name step for step.
#include "data/tokenizer/hf_components.h"

#include <algorithm>

#include "util/error.h"

namespace shardlm::data::hf {

namespace {
// The GPT-2 pre-tokenization regex (ByteLevel with use_regex).
constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
}  // namespace

// ---- Pattern ----------------------------------------------------------------------------------

Pattern Pattern::literal(std::string s) {
  Pattern p;
  p.literal_ = std::move(s);
  return p;
}

Pattern Pattern::regex(const std::string& re, const std::string& what) {
  Pattern p;
  p.regex_ = std::make_shared<Regex>(re, what);
  return p;
}

Pattern Pattern::single_char(char32_t c) {
  std::string s;
  append_utf8(s, c);
  return literal(s);  // a one-character literal finds the same spans as the char pattern
}

void Pattern::find_matches(std::string_view text, std::vector<Span>& out) const {
  out.clear();
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  size_t prev = 0;
  auto add = [&](size_t s, size_t e) {
    if (prev != s) out.push_back({prev, s, false});
    out.push_back({s, e, true});
    prev = e;
  };
  if (regex_) {
    thread_local std::vector<std::pair<size_t, size_t>> found;
    found.clear();
    regex_->find_all(text, found);
    for (const auto& [s, e] : found) add(s, e);
  } else {
    size_t at = 0;
    while ((at = text.find(literal_, at)) != std::string_view::npos) {
      add(at, at + literal_.size());
      at += literal_.size();
    }
  }
  if (prev != text.size()) out.push_back({prev, text.size(), false});
}

// ---- splitting --------------------------------------------------------------------------------

void split_pieces(std::vector<Piece>& pieces, const Pattern& pattern, SplitBehavior behavior, bool invert) {
  std::vector<Piece> result;
  result.reserve(pieces.size() * 4);
  thread_local std::vector<Pattern::Span> spans;
  struct Part {
    size_t start, end;
    bool remove;
  };
  thread_local std::vector<Part> parts;
  for (Piece& piece : pieces) {
    if (piece.added_id >= 0) {
      result.push_back(std::move(piece));
      continue;
    }
    pattern.find_matches(piece.text, spans);
    if (invert) {
      for (auto& s : spans) s.match = !s.match;
    }
    parts.clear();
    switch (behavior) {
      case SplitBehavior::Isolated:
        for (const auto& s : spans) parts.push_back({s.start, s.end, false});
        break;
      case SplitBehavior::Removed:
        for (const auto& s : spans) parts.push_back({s.start, s.end, s.match});
        break;
      case SplitBehavior::Contiguous: {
        bool previous = false;
        for (const auto& s : spans) {
          if (s.match == previous && !parts.empty()) {
            parts.back().end = s.end;
          } else {
            parts.push_back({s.start, s.end, false});
          }
          previous = s.match;
        }
        break;
      }
      case SplitBehavior::MergedWithPrevious: {
        bool previous = false;
        for (const auto& s : spans) {
          if (s.match && !previous && !parts.empty()) {
            parts.back().end = s.end;
          } else {
            parts.push_back({s.start, s.end, false});
          }
          previous = s.match;
        }
        break;
      }
      case SplitBehavior::MergedWithNext: {
        bool previous = false;
        for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
          if (it->match && !previous && !parts.empty()) {
            parts.back().start = it->start;
          } else {
            parts.push_back({it->start, it->end, false});
          }
          previous = it->match;
        }
        std::reverse(parts.begin(), parts.end());
        break;
      }
    }
    bool first = true;
    for (const Part& p : parts) {
      if (p.remove || p.end == p.start) {
        // a removed or empty part: the next part does not start the piece
        if (p.end != p.start) first = false;
        continue;
      }
      Piece out;
      out.text.assign(piece.text, p.start, p.end - p.start);
      out.at_origin = piece.at_origin && first && p.start == 0;
      first = false;
      result.push_back(std::move(out));
    }
  }
  pieces.swap(result);
}

// ---- normalizers ------------------------------------------------------------------------------

void ReplaceNormalizer::normalize(std::string& s) const {
  thread_local std::vector<Pattern::Span> spans;
  pattern_.find_matches(s, spans);
  std::string out;
  out.reserve(s.size());
  for (const auto& sp : spans) {
    if (sp.match) {
      out += content_;
    } else {
      out.append(s, sp.start, sp.end - sp.start);
    }
  }
  s.swap(out);
}

void StripNormalizer::normalize(std::string& s) const {
  size_t begin = 0, end = s.size();
  if (left_) {
    while (begin < end) {
      size_t i = begin;
      if (!is_white_space(next_char(s, i))) break;
      begin = i;
    }
  }
  if (right_) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      size_t i = start;
      if (!is_white_space(next_char(s, i))) break;
      end = start;
    }
  }
  s = s.substr(begin, end - begin);
}

// ---- pre-tokenizers ---------------------------------------------------------------------------

void SplitPreTokenizer::pre_tokenize(std::vector<Piece>& pieces) const {
  split_pieces(pieces, pattern_, behavior_, invert_);
}

ByteLevelPreTokenizer::ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
    : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {
  if (use_regex_) regex_ = std::make_shared<Regex>(kGpt2Regex, "ByteLevel pre-tokenizer");
}

void ByteLevelPreTokenizer::pre_tokenize(std::vector<Piece>& pieces) const {
  const ByteLevelTable& table = byte_level_table();
  std::vector<Piece> result;
  result.reserve(pieces.size() * 8);
  thread_local std::vector<std::pair<size_t, size_t>> found;
  thread_local std::string prefixed;
  auto emit = [&](std::string_view text, bool at_origin) {
    Piece out;
    out.text.reserve(text.size() * 2);
    for (char c : text) out.text += table.byte_to_utf8[static_cast<unsigned char>(c)];
    out.at_origin = at_origin;
    result.push_back(std::move(out));
  };
  for (Piece& piece : pieces) {
    if (piece.added_id >= 0) {
      result.push_back(std::move(piece));
      continue;
    }
    std::string_view text = piece.text;
    if (add_prefix_space_ && (text.empty() || text[0] != ' ')) {
      prefixed.assign(" ").append(text);
      text = prefixed;
    }
    if (!use_regex_) {
      if (!text.empty()) emit(text, piece.at_origin);
      continue;
    }
    found.clear();
    regex_->find_all(text, found);
    // Isolated split: matches and the gaps between them, each its own piece.
    size_t prev = 0;
    bool first = true;
    for (const auto& [s, e] : found) {
      if (prev != s) {
        emit(text.substr(prev, s - prev), piece.at_origin && first);
        first = false;
      }
      if (e != s) {
        emit(text.substr(s, e - s), piece.at_origin && first);
        first = false;
      }
      prev = e;
    }
    if (prev != text.size()) emit(text.substr(prev), piece.at_origin && first);
  }
  pieces.swap(result);
}

MetaspacePreTokenizer::MetaspacePreTokenizer(char32_t replacement, PrependScheme scheme, bool split)
    : replacement_(replacement), scheme_(scheme), split_(split) {
  append_utf8(rep_, replacement);
}

void MetaspacePreTokenizer::pre_tokenize(std::vector<Piece>& pieces) const {
  for (Piece& piece : pieces) {
    if (piece.added_id >= 0) continue;
    std::string& s = piece.text;
    std::string out;
    out.reserve(s.size() + rep_.size() * 4);
    for (char c : s) {
      if (c == ' ') {
        out += rep_;
      } else {
        out += c;
      }
    }
    const bool starts = out.compare(0, rep_.size(), rep_) == 0;
    if ((scheme_ == PrependScheme::Always && !starts) ||
        (scheme_ == PrependScheme::First && !starts && piece.at_origin)) {
      out.insert(0, rep_);
    }
    s.swap(out);
  }
  if (split_) split_pieces(pieces, Pattern::single_char(replacement_), SplitBehavior::MergedWithNext, false);
}

// ---- decoders ---------------------------------------------------------------------------------

void ByteLevelDecoder::decode_chain(std::vector<std::string>& tokens) const {
  const ByteLevelTable& table = byte_level_table();
  std::string bytes;
  std::string token_bytes;
  for (const std::string& t : tokens) {
    token_bytes.clear();
    bool ok = true;
    for (size_t i = 0; i < t.size() && ok;) {
      const char32_t c = next_char(t, i);
      if (c < 512 && table.char_to_byte[c] >= 0) {
        token_bytes.push_back(static_cast<char>(table.char_to_byte[c]));
      } else {
        ok = false;
      }
    }
    bytes += ok ? token_bytes : t;
  }
  tokens.assign(1, utf8_lossy(bytes));
}

void MetaspaceDecoder::decode_chain(std::vector<std::string>& tokens) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    std::string out;
    out.reserve(t.size());
    for (size_t k = 0; k < t.size();) {
      const size_t begin = k;
      const char32_t c = next_char(t, k);
      if (c == replacement_) {
        if (!(i == 0 && scheme_ != PrependScheme::Never)) out += ' ';
      } else {
        out.append(t, begin, k - begin);
      }
    }
    tokens[i].swap(out);
  }
}

void ReplaceDecoder::decode_chain(std::vector<std::string>& tokens) const {
  thread_local std::vector<Pattern::Span> spans;
  for (std::string& t : tokens) {
    pattern_.find_matches(t, spans);
    std::string out;
    for (const auto& sp : spans) {
      if (sp.match) {
        out += content_;
      } else {
        out.append(t, sp.start, sp.end - sp.start);
      }
    }
    t.swap(out);
  }
}

void ByteFallbackDecoder::decode_chain(std::vector<std::string>& tokens) const {
  std::vector<std::string> out;
  std::string pending;
  auto flush = [&] {
    if (pending.empty()) return;
    if (invalid_utf8_at(pending) == std::string::npos) {
      out.push_back(pending);
    } else {
      for (size_t k = 0; k < pending.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
    }
    pending.clear();
  };
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::string& t : tokens) {
    int byte = -1;
    if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
      const int hi = hex(t[3]), lo = hex(t[4]);
      if (hi >= 0 && lo >= 0) byte = hi * 16 + lo;
    }
    if (byte >= 0) {
      pending.push_back(static_cast<char>(byte));
    } else {
      flush();
      out.push_back(std::move(t));
    }
  }
  flush();
  tokens.swap(out);
}

void FuseDecoder::decode_chain(std::vector<std::string>& tokens) const {
  std::string all;
  for (const std::string& t : tokens) all += t;
  tokens.assign(1, all);
}

void StripDecoder::decode_chain(std::vector<std::string>& tokens) const {
  for (std::string& t : tokens) {
    std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, char)
    for (size_t i = 0; i < t.size();) {
      const size_t at = i;
      chars.emplace_back(at, next_char(t, i));
    }
    size_t start_cut = 0;
    for (size_t i = 0; i < chars.size() && i < start_; ++i) {
      if (chars[i].second != content_) break;
      start_cut = i + 1;
    }
    size_t stop_cut = chars.size();
    for (size_t i = 0; i < stop_ && i < chars.size(); ++i) {
      const size_t index = chars.size() - i - 1;
      if (chars[index].second != content_) break;
      stop_cut = index;
    }
    if (stop_cut < start_cut) stop_cut = start_cut;
    const size_t b = start_cut < chars.size() ? chars[start_cut].first : t.size();
    const size_t e = stop_cut < chars.size() ? chars[stop_cut].first : t.size();
    t = t.substr(b, e - b);
  }
}

}  // namespace shardlm::data::hf
