// The documents of `shardlm prepare`'s inputs, read as a stream: a corpus of any size passes
// through a bounded buffer, and every rule about what counts as a document lives here, once.
//   - Inputs are files or glob patterns (a pattern's matches in sorted order), read in the order
//     given; a name ending in .gz is gunzipped as it is read (zlib).
//   - A file named *.jsonl or *.ndjson (before .gz) holds one JSON object per line; the document is
//     its string field `text_field` (default "text"). Blank lines are skipped.
//   - Any other file is UTF-8 text, cut into documents by `unit`: Line (each line holding a
//     non-whitespace character; a trailing '\r' is dropped), Block (runs of such lines separated by
//     blank lines, joined with '\n'), or File (the whole file, if it holds a non-whitespace
//     character).
//   - Bad input: a line that is not a JSON object, lacks the field or holds a non-string or an empty
//     (whitespace-only) text, and text that is not valid UTF-8 (in a text file; JSON's own parser
//     rejects it inside strings). Each is an error naming the file and line, or with
//     skip_bad_lines skipped and counted; a file left without any document (empty, or all bad)
//     is then skipped and counted too, instead of stopping the run. Text is never repaired: a document is encoded exactly as
//     its bytes are, or not at all.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shardlm::data {

enum class TextUnit { Line, Block, File };
// "line" | "block" | "file" (the --text-unit flag).
TextUnit parse_text_unit(const std::string& name);

struct DocumentOptions {
  TextUnit unit = TextUnit::Line;
  std::string text_field = "text";
  bool skip_bad_lines = false;
  // JSON lines only (next_record): the string fields of each object, read instead of text_field
  // (fine-tuning's prompt and completion); each must be present and non-empty, as text_field.
  std::vector<std::string> fields;
  // JSON lines only (next_record): each non-blank line as it is, unparsed, as the one field of the
  // record (conversations, data/prep/conversation.h, which parses and checks it).
  bool raw_json_lines = false;
};

// The files of `inputs` (paths or glob patterns), checked to exist; a pattern matching nothing, a
// missing file or a folder is an error naming it.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs);

// Whether a file is read as JSON lines (by its name, see above).
bool is_jsonl(const std::string& path);

// Whether `text` is valid UTF-8 (no overlongs, surrogates or code points over U+10FFFF); when it
// is not, *bad_offset is the first bad byte's offset.
bool valid_utf8(const std::string& text, size_t* bad_offset);

class DocumentReader {
 public:
  DocumentReader(std::vector<std::string> files, DocumentOptions options);
  ~DocumentReader();
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;

  // The next document into *doc; false after the last one. Throws shardlm::Error on bad input
  // (unless skipped) and on a file that cannot be read, or has no document at all.
  bool next(std::string* doc);
  // The next record of options.fields (JSON lines only) into *fields, in their order; false after
  // the last one. Bad lines as for next().
  bool next_record(std::vector<std::string>* fields);
  // "file F line L": where the last document or record came from (for messages).
  std::string where() const;

  int64_t skipped() const { return skipped_; }        // bad lines (Block: lines of dropped blocks) skipped
  int64_t skipped_files() const { return skipped_files_; }  // files left without a document (skip_bad_lines)
  int64_t bytes_read() const;                           // input bytes consumed so far (compressed)

 private:
  bool open_next_file();
  bool read_line(std::string* line);  // one line of the current file, '\n' removed
  bool next_in_file(std::string* doc);
  bool next_json_in_file(std::vector<std::string>* out);  // the JSON-lines part of next_in_file
  void bad(const std::string& what);  // throws, or counts the skip

  struct Input;
  std::vector<std::string> files_;
  DocumentOptions options_;
  size_t next_file_ = 0;
  std::unique_ptr<Input> input_;
  int64_t skipped_ = 0, skipped_files_ = 0, bytes_done_ = 0;
};

}  // namespace shardlm::data
