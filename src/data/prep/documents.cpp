// Reading prepare's inputs as documents (rules in documents.h). zlib's gz reader serves plain and
// gzipped files alike, so there is one read path; nlohmann::json parses JSON lines and rejects
// ill-formed UTF-8 inside their strings.
#include "data/prep/documents.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/glob.h"

namespace shardlm::data {
namespace {

bool has_content(const std::string& text) { return text.find_first_not_of(" \t\r\n\v\f") != std::string::npos; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string hex_byte(unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", c);
  return buf;
}

}  // namespace

TextUnit parse_text_unit(const std::string& name) {
  if (name == "line") return TextUnit::Line;
  if (name == "block") return TextUnit::Block;
  if (name == "file") return TextUnit::File;
  fail("unknown --text-unit '", name, "'; use line (a document per non-empty line), block (per run of ",
       "lines between blank lines) or file (per input file)");
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  if (inputs.empty()) fail("no input text files; pass at least one --input FILE");
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code ec;  // a file whose name holds *, ? or [ is itself, not a pattern
    if (util::is_glob(input) && !std::filesystem::exists(input, ec)) {
      const std::vector<std::string> matches = util::glob_sorted(input);
      if (matches.empty()) fail("input pattern ", input, " matches no file; check the --input pattern");
      files.insert(files.end(), matches.begin(), matches.end());
      continue;
    }
    files.push_back(input);
  }
  for (const std::string& path : files) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      fail("input text file ", path, " does not exist or is not a file; check the --input path");
    }
  }
  return files;
}

bool is_jsonl(const std::string& path) {
  const std::string name = ends_with(path, ".gz") ? path.substr(0, path.size() - 3) : path;
  return ends_with(name, ".jsonl") || ends_with(name, ".ndjson");
}

bool valid_utf8(const std::string& text, size_t* bad_offset) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      *bad_offset = i;
      return false;
    }
    if (i + len > n) {
      *bad_offset = i;
      return false;
    }
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) {
        *bad_offset = i + k;
        return false;
      }
      cp = cp << 6 | (s[i + k] & 0x3F);
    }
    const bool overlong = (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
    if (overlong || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
      *bad_offset = i;
      return false;
    }
    i += len;
  }
  return true;
}

struct DocumentReader::Input {
  std::string path;
  gzFile gz = nullptr;
  bool jsonl = false;
  bool eof = false;
  int64_t line = 0;       // lines read so far (the current line's 1-based number)
  int64_t documents = 0;  // documents this file gave
  int64_t skipped = 0;
  std::vector<char> chunk = std::vector<char>(1 << 17);
  size_t pos = 0, len = 0;  // unread bytes of chunk: [pos, len)
  ~Input() {
    if (gz) gzclose(gz);
  }
};

DocumentReader::DocumentReader(std::vector<std::string> files, DocumentOptions options)
    : files_(std::move(files)), options_(std::move(options)) {}

DocumentReader::~DocumentReader() = default;

int64_t DocumentReader::bytes_read() const {
  return bytes_done_ + (input_ && input_->gz ? static_cast<int64_t>(gzoffset(input_->gz)) : 0);
}

bool DocumentReader::open_next_file() {
  if (input_) {
    if (input_->documents == 0 && options_.skip_bad_lines) {
      ++skipped_files_;  // a file of only bad lines, or none: skipped like its lines (prepare fails if all are)
    } else if (input_->documents == 0) {
      if (input_->skipped > 0) {
        fail("input file ", input_->path, " has no usable document: all ", input_->skipped,
             " were bad and skipped; check the file and --text-field");
      }
      fail("input text file ", input_->path, " has no non-empty lines, so no document; ",
           input_->jsonl ? "each non-blank line must be a JSON object with the text field"
                         : "pass a UTF-8 text file (plain or .gz)");
    }
    bytes_done_ += static_cast<int64_t>(gzoffset(input_->gz));
    input_.reset();
  }
  if (next_file_ == files_.size()) return false;
  input_ = std::make_unique<Input>();
  input_->path = files_[next_file_++];
  input_->jsonl = is_jsonl(input_->path);
  input_->gz = gzopen(input_->path.c_str(), "rb");
  if (!input_->gz) fail("cannot open input file ", input_->path, ": ", std::strerror(errno), "; check its permissions");
  gzbuffer(input_->gz, 1 << 17);
  return true;
}

bool DocumentReader::read_line(std::string* line) {
  Input& in = *input_;
  line->clear();
  bool any = false;
  while (true) {
    if (in.pos == in.len) {
      if (in.eof) break;
      const int got = gzread(in.gz, in.chunk.data(), static_cast<unsigned>(in.chunk.size()));
      int err = Z_OK;
      const char* msg = gzerror(in.gz, &err);
      // At the end of input, Z_BUF_ERROR means it ended inside a gzip stream (zlib.h, gzread).
      if (got < 0 || (got == 0 && err == Z_BUF_ERROR)) {
        fail("cannot read input file ", in.path, " after line ", in.line, ": ", msg,
             "; the file is truncated or corrupt (a .gz must be a complete gzip stream)");
      }
      in.pos = 0;
      in.len = static_cast<size_t>(got);
      if (got == 0) {
        in.eof = true;
        break;
      }
    }
    any = true;
    const char* start = in.chunk.data() + in.pos;
    const void* nl = std::memchr(start, '\n', in.len - in.pos);
    if (nl) {
      const size_t n = static_cast<const char*>(nl) - start;
      line->append(start, n);
      in.pos += n + 1;
      ++in.line;
      return true;
    }
    line->append(start, in.len - in.pos);
    in.pos = in.len;
  }
  if (any) ++in.line;  // a last line without '\n'
  return any;
}

void DocumentReader::bad(const std::string& what) {
  if (!options_.skip_bad_lines) {
    fail("input file ", input_->path, " line ", input_->line, ": ", what,
         "; fix the line, or pass --skip-bad-lines to skip such lines (they are counted)");
  }
  ++skipped_;
  ++input_->skipped;
}

bool DocumentReader::next_json_in_file(std::vector<std::string>* out) {
  const std::vector<std::string> fields = options_.fields.empty() ? std::vector<std::string>{options_.text_field}
                                                                  : options_.fields;
  const std::string hint = options_.fields.empty() ? "name the text field with --text-field"
                                                   : "name the fields with --prompt-field / --completion-field";
  std::string line;
  while (read_line(&line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!has_content(line)) continue;
    if (options_.raw_json_lines) {
      out->assign(1, std::move(line));
      return true;
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      bad(std::string("is not valid JSON (") + e.what() + ")");
      continue;
    }
    if (!j.is_object()) {
      bad(std::string("is a JSON ") + j.type_name() + ", not an object with a \"" + fields[0] + "\" field");
      continue;
    }
    out->clear();
    for (const std::string& field : fields) {
      const auto it = j.find(field);
      if (it == j.end()) {
        std::string keys;
        for (const auto& kv : j.items()) keys += (keys.empty() ? "" : ", ") + kv.key();
        bad("has no field \"" + field + "\" (its fields: " + keys + "); " + hint);
        break;
      }
      if (!it->is_string()) {
        bad("field \"" + field + "\" is a JSON " + it->type_name() + ", not a string");
        break;
      }
      if (!has_content(it->get_ref<const std::string&>())) {
        bad("field \"" + field + "\" is empty (no non-whitespace character)");
        break;
      }
      out->push_back(it->get<std::string>());
    }
    if (out->size() == fields.size()) return true;
  }
  return false;
}

bool DocumentReader::next_in_file(std::string* doc) {
  Input& in = *input_;
  std::string line;
  size_t off = 0;
  if (in.jsonl) {
    std::vector<std::string> out;
    if (!next_json_in_file(&out)) return false;
    *doc = std::move(out[0]);
    return true;
  }
  if (options_.unit == TextUnit::File) {
    doc->clear();
    bool ok = true;
    while (read_line(&line)) {
      if (ok && !valid_utf8(line, &off)) {
        bad("is not valid UTF-8 (byte " + hex_byte(static_cast<unsigned char>(line[off])) + " at byte " +
            std::to_string(off) + " of the line); convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)");
        ok = false;
      }
      doc->append(line);
      if (!in.eof) doc->push_back('\n');
    }
    if (in.documents > 0 || !ok || !has_content(*doc)) return false;  // one document per file
    return true;
  }
  // Line and Block.
  doc->clear();
  bool ok = true;
  bool any = false;
  while (read_line(&line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!has_content(line)) {
      if (options_.unit == TextUnit::Block && any) {
        if (ok) return true;
        doc->clear();  // a skipped block
        ok = true;
        any = false;
      }
      continue;
    }
    if (!valid_utf8(line, &off)) {
      bad("is not valid UTF-8 (byte " + hex_byte(static_cast<unsigned char>(line[off])) + " at byte " +
          std::to_string(off) + " of the line); convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)");
      if (options_.unit == TextUnit::Line) continue;
      ok = false;
    }
    if (options_.unit == TextUnit::Line) {
      *doc = std::move(line);
      return true;
    }
    if (any) doc->push_back('\n');
    doc->append(line);
    any = true;
  }
  return any && ok;
}

bool DocumentReader::next(std::string* doc) {
  while (true) {
    if (!input_ && !open_next_file()) return false;
    if (next_in_file(doc)) {
      ++input_->documents;
      return true;
    }
    if (!open_next_file()) return false;
  }
}

bool DocumentReader::next_record(std::vector<std::string>* fields) {
  while (true) {
    if (!input_ && !open_next_file()) return false;
    if (!input_->jsonl) {
      fail("input file ", input_->path, " is not JSON lines (*.jsonl or *.ndjson, optionally .gz), which ",
           "fine-tuning data must be: one object per line with the prompt and completion fields");
    }
    if (next_json_in_file(fields)) {
      ++input_->documents;
      return true;
    }
    if (!open_next_file()) return false;
  }
}

std::string DocumentReader::where() const {
  return input_ ? "file " + input_->path + " line " + std::to_string(input_->line) : std::string("the inputs");
}

}  // namespace shardlm::data
