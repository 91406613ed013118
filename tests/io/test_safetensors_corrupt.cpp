// safetensors corruption: every malformed file is rejected with an error that
// names the file and, where one is at fault, the tensor.
#include "io/ckpt/safetensors.hpp"
#include "tests/io/io_test_util.hpp"

#include <doctest/doctest.h>

using namespace dsa;
using namespace dsa::ckpt;
using dsa::test::le_u64;
using dsa::test::safetensors_bytes;
using dsa::test::scratch_dir;
using dsa::test::write_raw;

namespace {

struct corruption {
  const char* label;
  std::string bytes;  // the whole file
  const char* tensor; // named in the error, or "" when no tensor is at fault
  const char* phrase; // a part of the message that says what is wrong
};

// A one-tensor entry.
std::string entry(const std::string& name, const std::string& body) {
  return "\"" + name + "\":{" + body + "}";
}

std::string file_of(const std::string& entries, std::size_t data_bytes) {
  return safetensors_bytes("{" + entries + "}", std::string(data_bytes, '\x5a'));
}

std::vector<corruption> corruptions() {
  const std::string ok_a = entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])");
  std::string valid_header = "{" + ok_a + "}";
  return {
      {"empty file", "", "", "shorter than the 8-byte header length"},
      {"7 bytes", std::string(7, '\0'), "", "shorter than the 8-byte header length"},
      {"header length past the end", le_u64(100) + "{}", "", "header length 100 is larger"},
      {"huge header length", le_u64(~std::uint64_t{0}) + "{}", "", "is larger"},
      {"header cut short by the end of file", le_u64(valid_header.size() + 5) + valid_header, "",
       "is larger"},
      {"header cut inside the JSON", safetensors_bytes(valid_header.substr(0, 20), ""), "",
       "not valid JSON"},
      {"bad JSON", safetensors_bytes("{\"a\":", ""), "", "not valid JSON"},
      {"NUL padding", safetensors_bytes(std::string("{}\0\0", 4), ""), "",
       "NUL byte at header offset 2"},
      {"NUL inside the header", safetensors_bytes(std::string("{}\0garbage", 10), ""), "",
       "NUL byte"},
      {"header is an array", safetensors_bytes("[1,2]  ", ""), "", "must begin with '{'"},
      {"leading space", safetensors_bytes(" {}     ", ""), "", "must begin with '{'"},
      {"empty header", safetensors_bytes("", ""), "", "must begin with '{'"},
      {"invalid UTF-8 in a name", safetensors_bytes("{\"\xff\":1}", ""), "", "not valid JSON"},
      {"duplicate name", file_of(ok_a + "," + ok_a, 8), "a", "twice"},
      {"entry not an object", file_of(R"("w":[1,2])", 0), "w", "expected an object"},
      {"missing dtype", file_of(entry("w", R"("shape":[2],"data_offsets":[0,8])"), 8), "w",
       "missing field 'dtype'"},
      {"missing shape", file_of(entry("w", R"("dtype":"F32","data_offsets":[0,8])"), 8), "w",
       "missing field 'shape'"},
      {"missing data_offsets", file_of(entry("w", R"("dtype":"F32","shape":[2])"), 8), "w",
       "missing field 'data_offsets'"},
      {"dtype not a string",
       file_of(entry("w", R"("dtype":4,"shape":[2],"data_offsets":[0,8])"), 8), "w",
       "field 'dtype' is number"},
      {"shape not an array",
       file_of(entry("w", R"("dtype":"F32","shape":2,"data_offsets":[0,8])"), 8), "w",
       "field 'shape' is number"},
      {"shape with a float",
       file_of(entry("w", R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])"), 8), "w",
       "not a list of non-negative integers"},
      {"shape with a string",
       file_of(entry("w", R"("dtype":"F32","shape":["2"],"data_offsets":[0,8])"), 8), "w",
       "not a list of non-negative integers"},
      {"negative dimension",
       file_of(entry("w", R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])"), 8), "w",
       "negative dimension"},
      {"shape overflow",
       file_of(entry("w", R"("dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8])"),
               8),
       "w", "overflows"},
      {"offsets not a pair",
       file_of(entry("w", R"("dtype":"F32","shape":[2],"data_offsets":[0,8,8])"), 8), "w",
       "not a pair"},
      {"negative offset",
       file_of(entry("w", R"("dtype":"F32","shape":[2],"data_offsets":[-8,0])"), 8), "w",
       "not a pair"},
      {"offsets mistyped",
       file_of(entry("w", R"("dtype":"F32","shape":[2],"data_offsets":"0-8")"), 8), "w",
       "field 'data_offsets' is string"},
      {"unknown dtype", file_of(entry("w", R"("dtype":"F33","shape":[2],"data_offsets":[0,8])"), 8),
       "w", "unknown dtype 'F33'"},
      {"lower-case dtype",
       file_of(entry("w", R"("dtype":"f32","shape":[2],"data_offsets":[0,8])"), 8), "w",
       "unknown dtype 'f32'"},
      {"end before begin",
       file_of(entry("w", R"("dtype":"U8","shape":[0],"data_offsets":[8,0])"), 8), "w",
       "end before they begin"},
      {"size mismatch", file_of(entry("w", R"("dtype":"F32","shape":[3],"data_offsets":[0,8])"), 8),
       "w", "hold 8 bytes, but F32 [3] needs 12"},
      {"offsets past the data",
       file_of(entry("w", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])"), 4), "w",
       "run past the data section of 4 bytes"},
      {"empty tensor past the data",
       file_of(entry("w", R"("dtype":"F32","shape":[0],"data_offsets":[9,9])"), 8), "w",
       "run past the data section"},
      {"overlap",
       file_of(ok_a + "," + entry("w", R"("dtype":"U8","shape":[4],"data_offsets":[4,8])"), 8), "w",
       "overlap tensor 'a'"},
      {"same range twice",
       file_of(ok_a + "," + entry("w", R"("dtype":"I32","shape":[2],"data_offsets":[0,8])"), 8),
       "w", "overlap tensor 'a'"},
      {"hole",
       file_of(ok_a + "," + entry("w", R"("dtype":"U8","shape":[2],"data_offsets":[10,12])"), 12),
       "w", "hole in the data section: bytes [8, 10)"},
      {"hole at the start",
       file_of(entry("w", R"("dtype":"U8","shape":[2],"data_offsets":[2,4])"), 4), "w",
       "bytes [0, 2)"},
      {"trailing bytes", file_of(ok_a, 9), "",
       "data section has 9 bytes but the tensors cover only 8"},
      {"data without tensors", file_of("", 1), "", "cover only 0"},
      {"metadata not an object", file_of(R"("__metadata__":"pt",)" + ok_a, 8), "",
       "__metadata__ is string"},
      {"metadata value not a string", file_of(R"("__metadata__":{"step":3},)" + ok_a, 8), "",
       "__metadata__ value of 'step' is number"},
  };
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("every corruption is rejected, naming the file and the tensor at fault") {
  scratch_dir dir;
  int index = 0;
  for (const auto& c : corruptions()) {
    std::string path = dir.file(fmt::format("case{}.safetensors", index++));
    write_raw(path, c.bytes);
    for (bool header_only : {false, true}) {
      std::string what =
          std::string(c.label) + (header_only ? " (header reader)" : " (full reader)");
      INFO(what);
      std::string message;
      if (header_only) {
        auto h = read_safetensors_header(path);
        REQUIRE_FALSE(h);
        CHECK(h.err().code == errc::format);
        message = h.err().message;
      } else {
        auto r = read_safetensors(path);
        REQUIRE_FALSE(r);
        CHECK(r.err().code == errc::format);
        message = r.err().message;
      }
      INFO(message);
      CHECK(contains(message, path));
      if (*c.tensor != '\0')
        CHECK(contains(message, fmt::format("'{}'", c.tensor)));
      CHECK(contains(message, c.phrase));
    }
  }
}

TEST_CASE("a valid file stays valid after the corruption helpers (control)") {
  scratch_dir dir;
  std::string path = dir.file("ok.safetensors");
  write_raw(path, file_of(entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])") + "," +
                              entry("e", R"("dtype":"F32","shape":[0],"data_offsets":[8,8])") +
                              "," + entry("w", R"("dtype":"U8","shape":[2],"data_offsets":[8,10])"),
                          10));
  auto r = read_safetensors(path);
  REQUIRE_MESSAGE(r, r.err().to_string());
  CHECK(r->tensors.size() == 3);
}

TEST_CASE("a missing file is not_found and names the path") {
  scratch_dir dir;
  std::string path = dir.file("absent.safetensors");
  auto r = read_safetensors(path);
  REQUIRE_FALSE(r);
  CHECK(r.err().code == errc::not_found);
  CHECK(contains(r.err().message, path));
}

TEST_CASE("every truncation of a valid file is rejected") {
  scratch_dir dir;
  std::string good = dir.file("good.safetensors");
  tensor t = tensor::empty({5}, dtype::i32);
  for (int i = 0; i < 5; ++i)
    t.data<std::int32_t>()[i] = i;
  REQUIRE(write_safetensors(good, {{"t", t}}, {{"k", "v"}}));
  std::string bytes = dsa::test::read_raw(good);
  std::string path = dir.file("cut.safetensors");
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    INFO("truncated to ", n, " of ", bytes.size());
    write_raw(path, bytes.substr(0, n));
    auto r = read_safetensors(path);
    REQUIRE_FALSE(r);
    CHECK(contains(r.err().message, path));
  }
}
