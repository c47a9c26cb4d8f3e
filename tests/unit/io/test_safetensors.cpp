// Tests for io/safetensors: bit-exact round trips for every supported dtype, a file written by an
// independent (Python, hand-rolled) writer, and one test per way a file can be broken, checking
// that the Error names the file/tensor and the problem.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "io/safetensors.h"
#include "util/error.h"

namespace shardlm::io {
namespace {

namespace fs = std::filesystem;

std::string fixture_path() {
  return std::string(SHARDLM_SOURCE_DIR) + "/tests/unit/io/data/python_fixture.safetensors";
}

// Each test gets a fresh directory in /tmp, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/shardlm_io_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return dir_ + "/" + name; }

  // A file with the given 8-byte length field (default: the header's size), header text and data.
  std::string write_raw(const std::string& header, const std::string& data, int64_t length = -1) {
    const std::string path = file("raw.safetensors");
    std::ofstream out(path, std::ios::binary);
    uint64_t n = length < 0 ? header.size() : static_cast<uint64_t>(length);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
    out << header << data;
    return path;
  }

  std::string dir_;
};

// Runs fn, expects a shardlm::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected shardlm::Error, got another exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected shardlm::Error, nothing was thrown";
}

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  at::Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * ca.element_size()) == 0;
}

// Random bit patterns (NaNs, infinities and subnormals included) so "bit-exact" means it.
at::Tensor random_bits(at::ScalarType type, std::vector<int64_t> shape, uint32_t seed) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
  std::mt19937 rng(seed);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  const int64_t n = t.numel() * t.element_size();
  for (int64_t i = 0; i < n; ++i) p[i] = type == at::kBool ? rng() % 2 : static_cast<uint8_t>(rng());
  return t;
}

const at::ScalarType kAllTypes[] = {at::kFloat, at::kHalf,  at::kBFloat16, at::kDouble, at::kLong,
                                    at::kInt,   at::kShort, at::kChar,     at::kByte,   at::kBool};

// ---- round trips --------------------------------------------------------------------------------

TEST_F(SafetensorsTest, RoundTripEveryDtypeBitExact) {
  NamedTensors in;
  uint32_t seed = 1;
  for (auto type : kAllTypes)
    in.emplace_back(std::string("t_") + c10::toString(type), random_bits(type, {3, 5, 7}, seed++));
  const std::string path = file("all.safetensors");
  save_safetensors(path, in);
  NamedTensors out = load_safetensors(path);
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].first, in[i].first);
    EXPECT_TRUE(out[i].second.is_contiguous());
    EXPECT_EQ(out[i].second.device().type(), at::kCPU);
    EXPECT_TRUE(same_bytes(out[i].second, in[i].second)) << in[i].first;
  }
}

TEST_F(SafetensorsTest, DtypeNamesFollowTheSpec) {
  const std::pair<at::ScalarType, const char*> names[] = {
      {at::kFloat, "F32"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"}, {at::kDouble, "F64"},
      {at::kLong, "I64"},  {at::kInt, "I32"},  {at::kShort, "I16"},     {at::kChar, "I8"},
      {at::kByte, "U8"},   {at::kBool, "BOOL"}};
  NamedTensors in;
  for (auto [type, name] : names) {
    EXPECT_EQ(safetensors_dtype_name(type), name);
    EXPECT_EQ(safetensors_scalar_type(name), type);
    in.emplace_back(name, at::zeros({2}, at::TensorOptions().dtype(type)));
  }
  const std::string path = file("names.safetensors");
  save_safetensors(path, in);
  auto infos = read_safetensors_header(path);
  ASSERT_EQ(infos.size(), in.size());
  for (size_t i = 0; i < infos.size(); ++i) EXPECT_EQ(infos[i].dtype, in[i].first);
  expect_error([] { safetensors_dtype_name(at::kComplexFloat); }, {"ComplexFloat", "not", "F32"});
  expect_error([] { safetensors_scalar_type("U32"); }, {"U32", "not supported"});
}

TEST_F(SafetensorsTest, ScalarAndEmptyTensors) {
  NamedTensors in = {{"before", at::arange(4, at::kFloat)},
                     {"scalar", at::scalar_tensor(3.5, at::kDouble)},
                     {"empty", at::empty({0, 3}, at::kLong)},
                     {"empty1d", at::empty({0}, at::kBFloat16)},
                     {"after", at::arange(3, at::kInt)}};
  const std::string path = file("edge.safetensors");
  save_safetensors(path, in);
  NamedTensors out = load_safetensors(path);
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].first, in[i].first);
    EXPECT_TRUE(same_bytes(out[i].second, in[i].second)) << in[i].first;
  }
  EXPECT_EQ(out[1].second.dim(), 0);
  EXPECT_EQ(out[1].second.item<double>(), 3.5);
  EXPECT_EQ(out[2].second.sizes(), (std::vector<int64_t>{0, 3}));
}

TEST_F(SafetensorsTest, NoTensorsAtAll) {
  const std::string path = file("nothing.safetensors");
  save_safetensors(path, {}, {{"k", "v"}});
  std::map<std::string, std::string> meta;
  EXPECT_TRUE(load_safetensors(path, &meta).empty());
  EXPECT_EQ(meta.at("k"), "v");
}

TEST_F(SafetensorsTest, MetadataRoundTrip) {
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"step", "1200"}, {"note", "quotes \" and\nnewlines and ünïcödé"}, {"", "empty key"}};
  const std::string path = file("meta.safetensors");
  save_safetensors(path, {{"w", at::ones({2, 2})}}, meta);
  std::map<std::string, std::string> got = {{"stale", "entry"}};
  load_safetensors(path, &got);
  EXPECT_EQ(got, meta);
  std::map<std::string, std::string> got_header;
  read_safetensors_header(path, &got_header);
  EXPECT_EQ(got_header, meta);
}

TEST_F(SafetensorsTest, FileOrderIsWriterOrderNotAlphabetical) {
  NamedTensors in;
  for (const char* name : {"zeta", "alpha", "model.layers.10.w", "model.layers.2.w", "beta"})
    in.emplace_back(name, at::ones({2}));
  const std::string path = file("order.safetensors");
  save_safetensors(path, in);
  NamedTensors out = load_safetensors(path);
  auto infos = read_safetensors_header(path);
  ASSERT_EQ(out.size(), in.size());
  ASSERT_EQ(infos.size(), in.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].first, in[i].first);
    EXPECT_EQ(infos[i].name, in[i].first);
    EXPECT_EQ(infos[i].begin, offset);  // laid out back to back
    offset = infos[i].end;
  }
}

TEST_F(SafetensorsTest, NonContiguousInputsAreWrittenAsTheirValues) {
  at::Tensor base = at::arange(24, at::kFloat).reshape({4, 6});
  at::Tensor transposed = base.t();                                           // strides reversed
  at::Tensor sliced = base.slice(/*dim=*/1, /*start=*/2, /*end=*/5);          // storage offset, gaps
  at::Tensor expanded = at::arange(3, at::kInt).unsqueeze(0).expand({2, 3});  // stride 0
  const std::string path = file("views.safetensors");
  save_safetensors(path, {{"t", transposed}, {"s", sliced}, {"e", expanded}});
  NamedTensors out = load_safetensors(path);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(at::equal(out[0].second, transposed));
  EXPECT_TRUE(at::equal(out[1].second, sliced));
  EXPECT_TRUE(at::equal(out[2].second, expanded));
  EXPECT_EQ(out[0].second.sizes(), (std::vector<int64_t>{6, 4}));
}

TEST_F(SafetensorsTest, TensorsRequiringGradAreSaved) {
  at::Tensor w = at::randn({3, 3}).set_requires_grad(true);
  const std::string path = file("grad.safetensors");
  save_safetensors(path, {{"w", w}});
  NamedTensors out = load_safetensors(path);
  EXPECT_TRUE(at::equal(out[0].second, w.detach()));
  EXPECT_FALSE(out[0].second.requires_grad());
}

TEST_F(SafetensorsTest, LargerTensorRoundTrip) {
  at::Tensor big = random_bits(at::kBFloat16, {1024, 3000}, 7);  // ~6 MB
  const std::string path = file("big.safetensors");
  save_safetensors(path, {{"a", at::ones({3})}, {"big", big}});
  NamedTensors out = load_safetensors(path);
  EXPECT_TRUE(same_bytes(out[1].second, big));
}

TEST_F(SafetensorsTest, WrittenLayoutFollowsTheFormat) {
  const std::string path = file("layout.safetensors");
  save_safetensors(path, {{"a", at::ones({3}, at::kFloat)}, {"b", at::ones({5}, at::kByte)}}, {{"x", "y"}});
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n % 8, 0u) << "header must be padded to a multiple of 8";
  EXPECT_EQ(bytes[8], '{');
  EXPECT_EQ(bytes.size(), 8 + n + 3 * 4 + 5);
  const std::string header = bytes.substr(8, n);
  EXPECT_NE(header.find("\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}"), std::string::npos)
      << header;
  EXPECT_NE(header.find("\"b\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[12,17]}"), std::string::npos)
      << header;
  EXPECT_NE(header.find("\"__metadata__\":{\"x\":\"y\"}"), std::string::npos) << header;
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));  // padding is spaces after the JSON
}

TEST_F(SafetensorsTest, SaveReplacesAtomicallyAndLeavesNoTemporary) {
  const std::string path = file("ckpt.safetensors");
  save_safetensors(path, {{"w", at::zeros({4})}});
  save_safetensors(path, {{"w", at::ones({4})}, {"v", at::ones({1})}});
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  NamedTensors out = load_safetensors(path);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(at::equal(out[0].second, at::ones({4})));
}

// ---- a file from an independent writer (tests/unit/io/make_fixture.py) ---------------------------

template <typename T>
std::vector<T> values(const at::Tensor& t) {
  return std::vector<T>(t.data_ptr<T>(), t.data_ptr<T>() + t.numel());
}

TEST(SafetensorsPython, ReadsFileWrittenByPython) {
  std::map<std::string, std::string> meta;
  NamedTensors got = load_safetensors(fixture_path(), &meta);
  EXPECT_EQ(meta, (std::map<std::string, std::string>{{"format", "pt"}, {"source", "make_fixture.py"}}));

  // The header lists these in reverse; load order must be the data order.
  const std::vector<std::string> order = {"z.weight", "a.bias", "m.half", "ids",    "scalar", "empty",
                                          "mask",     "bytes",  "small",  "shorts", "ints"};
  ASSERT_EQ(got.size(), order.size());
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(got[i].first, order[i]);
  auto t = [&](size_t i) { return got[i].second; };

  EXPECT_EQ(t(0).scalar_type(), at::kFloat);
  EXPECT_EQ(t(0).sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(values<float>(t(0)), (std::vector<float>{1.5f, -2.0f, 0.25f, 3.0f, -0.125f, 1e-3f}));

  EXPECT_EQ(t(1).scalar_type(), at::kBFloat16);
  EXPECT_EQ(values<float>(t(1).to(at::kFloat)), (std::vector<float>{1.0f, -0.5f, 3.140625f, -65536.0f}));

  EXPECT_EQ(t(2).scalar_type(), at::kHalf);
  EXPECT_EQ(t(2).sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(values<float>(t(2).to(at::kFloat)),
            (std::vector<float>{0.5f, -1.0f, 65504.0f, 6.103515625e-05f}));

  EXPECT_EQ(t(3).scalar_type(), at::kLong);
  EXPECT_EQ(values<int64_t>(t(3)), (std::vector<int64_t>{-1, 0, (int64_t{1} << 40) + 7}));

  EXPECT_EQ(t(4).scalar_type(), at::kDouble);
  EXPECT_EQ(t(4).dim(), 0);
  EXPECT_EQ(t(4).item<double>(), 2.718281828459045);

  EXPECT_EQ(t(5).scalar_type(), at::kInt);
  EXPECT_EQ(t(5).sizes(), (std::vector<int64_t>{0, 5}));

  EXPECT_EQ(t(6).scalar_type(), at::kBool);
  EXPECT_EQ(values<bool>(t(6)), (std::vector<bool>{true, false, false, true, true}));

  EXPECT_EQ(t(7).scalar_type(), at::kByte);
  EXPECT_EQ(values<uint8_t>(t(7)), (std::vector<uint8_t>{0, 127, 255}));
  EXPECT_EQ(t(8).scalar_type(), at::kChar);
  EXPECT_EQ(values<int8_t>(t(8)), (std::vector<int8_t>{-128, 127}));
  EXPECT_EQ(t(9).scalar_type(), at::kShort);
  EXPECT_EQ(values<int16_t>(t(9)), (std::vector<int16_t>{-32768, 1234}));
  EXPECT_EQ(t(10).scalar_type(), at::kInt);
  EXPECT_EQ(values<int32_t>(t(10)), (std::vector<int32_t>{-7, 2147483647}));

  auto infos = read_safetensors_header(fixture_path());
  ASSERT_EQ(infos.size(), order.size());
  EXPECT_EQ(infos[0].dtype, "F32");
  EXPECT_EQ(infos[0].begin, 0u);
  EXPECT_EQ(infos[0].end, 24u);
  EXPECT_EQ(infos[4].shape, std::vector<int64_t>{});
  EXPECT_EQ(infos.back().end, 94u);
}

// ---- broken files ---------------------------------------------------------------------------------

const char* kGoodEntry = R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";

TEST_F(SafetensorsTest, MissingFile) {
  const std::string path = file("does_not_exist.safetensors");
  expect_error([&] { load_safetensors(path); }, {path, "not found"});
  expect_error([&] { read_safetensors_header(path); }, {path, "not found"});
}

TEST_F(SafetensorsTest, DirectoryInsteadOfFile) {
  expect_error([&] { load_safetensors(dir_); }, {dir_, "not a regular file"});
}

TEST_F(SafetensorsTest, FileShorterThanLengthField) {
  const std::string path = file("short.safetensors");
  std::ofstream(path, std::ios::binary) << "abc";
  expect_error([&] { load_safetensors(path); }, {path, "3 bytes", "shorter than the 8-byte"});
}

TEST_F(SafetensorsTest, HeaderLengthLargerThanFile) {
  const std::string path = write_raw("{}", "", /*length=*/1000);
  expect_error([&] { load_safetensors(path); },
               {path, "header length 1000", "larger than the rest of the file"});
}

TEST_F(SafetensorsTest, HeaderLengthAbsurd) {
  const std::string path = write_raw("{}", "", /*length=*/int64_t{1} << 40);
  expect_error([&] { load_safetensors(path); }, {path, "implausible"});
}

TEST_F(SafetensorsTest, HeaderNotJson) {
  const std::string path = write_raw(R"({"w": {"dtype": "F32",)", std::string(24, '\0'));
  expect_error([&] { load_safetensors(path); }, {path, "not valid JSON"});
}

TEST_F(SafetensorsTest, HeaderNotAnObject) {
  expect_error([&] { load_safetensors(write_raw("[1, 2]  ", "")); }, {"array", "expected an object"});
}

TEST_F(SafetensorsTest, EntryMissingFields) {
  expect_error([&] { load_safetensors(write_raw(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", "abcd")); },
               {"'w'", "dtype"});
  expect_error([&] { load_safetensors(write_raw(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", "abcd")); },
               {"'w'", "shape"});
  expect_error([&] { load_safetensors(write_raw(R"({"w":{"dtype":"F32","shape":[1]}})", "abcd")); },
               {"'w'", "data_offsets"});
  expect_error([&] { load_safetensors(write_raw(R"({"w":[1,2,3]})", "")); }, {"'w'", "expected an object"});
}

TEST_F(SafetensorsTest, BadShapeAndOffsetValues) {
  expect_error(
      [&] {
        load_safetensors(write_raw(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd"));
      },
      {"'w'", "non-negative"});
  expect_error(
      [&] {
        load_safetensors(write_raw(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "abcd"));
      },
      {"'w'", "non-negative"});
  expect_error(
      [&] { load_safetensors(write_raw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "abcd")); },
      {"'w'", "data_offsets"});
  expect_error(
      [&] {
        load_safetensors(write_raw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", "abcd"));
      },
      {"'w'", "data_offsets"});
}

TEST_F(SafetensorsTest, UnknownAndUnsupportedDtypes) {
  expect_error(
      [&] {
        load_safetensors(write_raw(R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", "abcd"));
      },
      {"'w'", "unknown dtype", "Q7", "BF16"});
  expect_error(
      [&] {
        load_safetensors(write_raw(R"({"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", "abcd"));
      },
      {"'w'", "F8_E4M3", "not supported"});
  expect_error(
      [&] { load_safetensors(write_raw(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", "abcd")); },
      {"'w'", "dtype"});
}

TEST_F(SafetensorsTest, EndBeforeBegin) {
  expect_error(
      [&] {
        load_safetensors(
            write_raw(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[8,4]}})", std::string(8, 'x')));
      },
      {"'w'", "[8, 4]", "end before"});
}

TEST_F(SafetensorsTest, ByteSizeDoesNotMatchShape) {
  const std::string path =
      write_raw(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", std::string(24, 'x'));
  expect_error([&] { load_safetensors(path); }, {path, "'w'", "[2, 3]", "need 24 bytes", "hold 20 bytes"});
}

TEST_F(SafetensorsTest, TruncatedData) {
  const std::string header = std::string("{") + kGoodEntry + "}";
  const std::string path = write_raw(header, std::string(16, 'x'));
  expect_error([&] { load_safetensors(path); }, {path, "truncated", "'w'", "[0, 24)", "only 16 bytes"});
  // Validating the header alone finds it too, without reading tensor data.
  expect_error([&] { read_safetensors_header(path); }, {"truncated", "'w'"});
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  expect_error([&] { load_safetensors(write_raw(header, std::string(12, 'x'))); }, {"'a'", "'b'", "overlap"});
}

TEST_F(SafetensorsTest, EmptyTensorInsideAnotherIsNotAnOverlap) {
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})";
  EXPECT_EQ(load_safetensors(write_raw(header, std::string(8, 'x'))).size(), 2u);
}

TEST_F(SafetensorsTest, RepeatedTensorName) {
  const std::string header =
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})";
  expect_error([&] { load_safetensors(write_raw(header, "abcd")); }, {"'a'", "twice"});
}

TEST_F(SafetensorsTest, MetadataMustBeStrings) {
  expect_error([&] { load_safetensors(write_raw(R"({"__metadata__":{"step":12}})", "")); },
               {"metadata", "step", "strings"});
  expect_error([&] { load_safetensors(write_raw(R"({"__metadata__":[1]})", "")); },
               {"__metadata__", "object"});
}

TEST_F(SafetensorsTest, InvalidBoolBytes) {
  expect_error(
      [&] {
        load_safetensors(write_raw(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})",
                                   std::string("\x01\x00\x07", 3)));
      },
      {"'m'", "BOOL", "byte 2"});
}

TEST_F(SafetensorsTest, HeaderPaddingAndGapsAreAccepted) {
  // Trailing spaces after the JSON, as the official writer pads; unused bytes between tensors.
  const std::string header =
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}     )";
  NamedTensors out = load_safetensors(write_raw(header, "ABxxCD"));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(values<uint8_t>(out[1].second), (std::vector<uint8_t>{'C', 'D'}));
}

// ---- bad arguments to save --------------------------------------------------------------------------

TEST_F(SafetensorsTest, SaveRejectsBadInputsAndWritesNothing) {
  const std::string path = file("out.safetensors");
  save_safetensors(path, {{"keep", at::ones({2})}});
  expect_error(
      [&] {
        save_safetensors(path, {{"w", at::ones({1})}, {"w", at::ones({1})}});
      },
      {path, "'w'", "twice"});
  expect_error(
      [&] {
        save_safetensors(path, {{"c", at::ones({2}, at::kComplexFloat)}});
      },
      {"'c'", "ComplexFloat", "not supported"});
  expect_error([&] { save_safetensors(path, {{"u", at::Tensor()}}); }, {"'u'", "undefined"});
  expect_error([&] { save_safetensors(path, {{"", at::ones({1})}}); }, {"empty tensor name"});
  expect_error([&] { save_safetensors(path, {{"__metadata__", at::ones({1})}}); }, {"reserved"});
  expect_error([&] { save_safetensors(path, {{"bad\xff", at::ones({1})}}); }, {path, "UTF-8"});
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  NamedTensors still = load_safetensors(path);
  ASSERT_EQ(still.size(), 1u);
  EXPECT_EQ(still[0].first, "keep");
}

TEST_F(SafetensorsTest, SaveIntoMissingDirectory) {
  const std::string path = file("no/such/dir/out.safetensors");
  expect_error(
      [&] {
        save_safetensors(path, {{"w", at::ones({1})}});
      },
      {path, "cannot create", "directory exists"});
}

// ---- check_tensor_names_and_shapes ------------------------------------------------------------------

TEST(CheckNamesAndShapes, AcceptsExactMatchInAnyOrder) {
  NamedTensors loaded = {{"b", at::ones({2, 3})}, {"a", at::ones({4})}};
  EXPECT_NO_THROW(check_tensor_names_and_shapes("f.safetensors", loaded, {{"a", {4}}, {"b", {2, 3}}}));
}

TEST(CheckNamesAndShapes, ListsEveryProblem) {
  NamedTensors loaded = {{"ok", at::ones({2})}, {"extra", at::ones({1})}, {"bad", at::ones({3, 4})}};
  expect_error(
      [&] {
        check_tensor_names_and_shapes("ckpt.safetensors", loaded,
                                      {{"ok", {2}}, {"bad", {4, 3}}, {"gone", {5}}});
      },
      {"ckpt.safetensors", "1 missing", "1 with the wrong shape", "1 unexpected", "missing: gone [5]",
       "wrong shape: bad: model expects [4, 3], file has [3, 4]", "unexpected: extra [1]"});
}

TEST(CheckNamesAndShapes, LongListsAreCut) {
  NamedTensors loaded;
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
  for (int i = 0; i < 30; ++i) expected.emplace_back("layer." + std::to_string(i), std::vector<int64_t>{1});
  try {
    check_tensor_names_and_shapes("x.safetensors", loaded, expected);
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("30 missing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("layer.19"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("layer.20 "), std::string::npos) << msg;
    EXPECT_NE(msg.find("... and 10 more"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace shardlm::io
