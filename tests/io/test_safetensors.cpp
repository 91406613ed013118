// safetensors: round trips of every dtype, a file built byte by byte from the
// spec (so we match the format, not only ourselves), the written layout, the
// header-only reader and check_tensors.
#include "io/ckpt/safetensors.hpp"
#include "tests/io/io_test_util.hpp"

#include <doctest/doctest.h>

#include <cstring>

using namespace dsa;
using namespace dsa::ckpt;
using dsa::test::le_u64;
using dsa::test::read_raw;
using dsa::test::safetensors_bytes;
using dsa::test::scratch_dir;
using dsa::test::write_raw;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A tensor whose bytes are a pattern depending on `seed`.
tensor patterned(const shape_t& shape, dtype type, int seed) {
  tensor t = tensor::empty(shape, type);
  auto* bytes = static_cast<unsigned char*>(t.raw_data());
  for (std::size_t i = 0; i < t.nbytes(); ++i)
    bytes[i] = static_cast<unsigned char>(i * 31 + seed * 7 + 1);
  return t;
}

bool same_bytes(const tensor& a, const tensor& b) {
  return a.type() == b.type() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

std::string header_of(const std::string& file) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(file[static_cast<std::size_t>(i)]);
  return file.substr(8, n);
}

} // namespace

TEST_CASE("round trip of every dtype, 0-d and empty tensors, and metadata") {
  scratch_dir dir;
  std::string path = dir.file("model.safetensors");
  named_tensors tensors;
  int seed = 0;
  for (dtype type : {dtype::f32, dtype::f16, dtype::bf16, dtype::i32, dtype::i64, dtype::u8}) {
    std::string base = dtype_name(type);
    for (const shape_t& shape :
         {shape_t{}, shape_t{0}, shape_t{1}, shape_t{7}, shape_t{2, 3, 5}, shape_t{3, 0, 2}})
      tensors[fmt::format("{}.{}", base, shape_string(shape))] = patterned(shape, type, ++seed);
  }
  metadata_map metadata{
      {"format", "pt"}, {"step", "1200"}, {"quote\"and\\slash", "üñí\ncode"}, {"", ""}};
  REQUIRE(write_safetensors(path, tensors, metadata));

  auto read = read_safetensors(path);
  REQUIRE_MESSAGE(read, read.err().to_string());
  CHECK(read->metadata == metadata);
  REQUIRE(read->tensors.size() == tensors.size());
  for (const auto& [name, t] : tensors) {
    INFO(name);
    REQUIRE(read->tensors.count(name) == 1);
    CHECK(same_bytes(read->tensors.at(name), t));
  }
  CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});
}

TEST_CASE("round trip without tensors and without metadata") {
  scratch_dir dir;
  std::string path = dir.file("empty.safetensors");
  REQUIRE(write_safetensors(path, {}));
  CHECK(read_raw(path) == le_u64(8) + "{}      ");
  auto read = read_safetensors(path);
  REQUIRE(read);
  CHECK(read->tensors.empty());
  CHECK(read->metadata.empty());
}

TEST_CASE("reads a file built by hand from the spec") {
  // Data order differs from name order; a U8 tensor puts F32 data at an odd
  // offset; the header has spaces inside and padding after; integers are little-endian.
  std::string header = R"({ "__metadata__": {"format": "pt", "note": "hand made"},
    "w": {"dtype": "F32", "shape": [2], "data_offsets": [3, 11]},
    "b": {"data_offsets": [0, 3], "shape": [3], "dtype": "U8"},
    "s": {"dtype": "I64", "shape": [], "data_offsets": [11, 19]},
    "h": {"dtype": "F16", "shape": [1, 2], "data_offsets": [19, 23]},
    "z": {"dtype": "BF16", "shape": [0, 4], "data_offsets": [23, 23]},
    "i": {"dtype": "I32", "shape": [1], "data_offsets": [23, 27]},
    "g": {"dtype": "BF16", "shape": [1], "data_offsets": [27, 29]} }   )";
  std::string data;
  data += std::string("\x01\x02\xff", 3);                     // b = [1, 2, 255]
  data += std::string("\x00\x00\x80\x3f\x00\x00\x20\xc1", 8); // w = [1.0, -10.0]
  data += std::string("\xfe\xff\xff\xff\xff\xff\xff\xff", 8); // s = -2
  data += std::string("\x00\x3c\x00\xc0", 4);                 // h = [[1.0, -2.0]] as f16 bits
  data += std::string("\x39\x30\x00\x00", 4);                 // i = [12345]
  data += std::string("\x80\x3f", 2);                         // g = [1.0] as bf16 bits
  scratch_dir dir;
  std::string path = dir.file("hand.safetensors");
  write_raw(path, safetensors_bytes(header, data));

  auto read = read_safetensors(path);
  REQUIRE_MESSAGE(read, read.err().to_string());
  const auto& t = read->tensors;
  CHECK(read->metadata == metadata_map{{"format", "pt"}, {"note", "hand made"}});
  REQUIRE(t.size() == 7);
  CHECK(t.at("b").shape() == shape_t{3});
  CHECK(t.at("b").data<std::uint8_t>()[2] == 255);
  CHECK(t.at("w").type() == dtype::f32);
  CHECK(t.at("w").data<float>()[0] == 1.0f);
  CHECK(t.at("w").data<float>()[1] == -10.0f);
  CHECK(t.at("s").ndim() == 0);
  CHECK(t.at("s").data<std::int64_t>()[0] == -2);
  CHECK(t.at("h").type() == dtype::f16);
  CHECK(t.at("h").shape() == shape_t{1, 2});
  CHECK(t.at("h").data<std::uint16_t>()[0] == 0x3c00);
  CHECK(t.at("h").data<std::uint16_t>()[1] == 0xc000);
  CHECK(t.at("z").shape() == shape_t{0, 4});
  CHECK(t.at("z").numel() == 0);
  CHECK(t.at("i").data<std::int32_t>()[0] == 12345);
  CHECK(t.at("g").type() == dtype::bf16);
  CHECK(t.at("g").data<std::uint16_t>()[0] == 0x3f80);
  // Tensors are loaded into their own aligned storage, not views at odd offsets.
  CHECK(reinterpret_cast<std::uintptr_t>(t.at("w").raw_data()) % alignof(float) == 0);
}

TEST_CASE("written layout: sorted names, contiguous data, header padded to 8 bytes") {
  scratch_dir dir;
  std::string path = dir.file("layout.safetensors");
  tensor a = tensor::empty({2}, dtype::f32);
  a.data<float>()[0] = 1.0f;
  a.data<float>()[1] = -10.0f;
  tensor b = tensor::empty({3}, dtype::u8);
  for (int i = 0; i < 3; ++i)
    b.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(i + 1);
  tensor c = tensor::empty({}, dtype::i64);
  c.data<std::int64_t>()[0] = -2;
  REQUIRE(write_safetensors(path, {{"c", c}, {"b.x", b}, {"a", a}}, {{"format", "pt"}}));

  std::string file = read_raw(path);
  std::string header = header_of(file);
  std::string json = R"({"__metadata__":{"format":"pt"},)"
                     R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b.x":{"dtype":"U8","shape":[3],"data_offsets":[8,11]},)"
                     R"("c":{"dtype":"I64","shape":[],"data_offsets":[11,19]}})";
  CHECK(header.substr(0, json.size()) == json);
  CHECK(header.size() % 8 == 0);
  CHECK(header.size() - json.size() < 8);
  CHECK(header.find_first_not_of(' ', json.size()) == std::string::npos);
  std::string data = file.substr(8 + header.size());
  CHECK(data ==
        std::string("\x00\x00\x80\x3f\x00\x00\x20\xc1\x01\x02\x03\xfe\xff\xff\xff\xff\xff\xff\xff",
                    19));
}

TEST_CASE("the data section starts at a multiple of 8 for every header length") {
  scratch_dir dir;
  std::string path = dir.file("pad.safetensors");
  std::string name;
  for (int len = 1; len <= 16; ++len) {
    name += 'n';
    REQUIRE(write_safetensors(path, {{name, patterned({3}, dtype::u8, len)}}));
    std::string file = read_raw(path);
    std::string header = header_of(file);
    INFO("name length ", len);
    CHECK((8 + header.size()) % 8 == 0);
    CHECK(file.size() == 8 + header.size() + 3);
    auto read = read_safetensors(path);
    REQUIRE(read);
    CHECK(same_bytes(read->tensors.at(name), patterned({3}, dtype::u8, len)));
  }
}

TEST_CASE("write refuses tensors it cannot represent, naming the file and tensor") {
  scratch_dir dir;
  std::string path = dir.file("bad.safetensors");
  auto undefined = write_safetensors(path, {{"ghost", tensor()}});
  REQUIRE_FALSE(undefined);
  CHECK(contains(undefined.err().message, path));
  CHECK(contains(undefined.err().message, "'ghost'"));
  auto reserved = write_safetensors(path, {{"__metadata__", patterned({1}, dtype::u8, 0)}});
  REQUIRE_FALSE(reserved);
  CHECK(contains(reserved.err().message, "__metadata__"));
  auto utf8 = write_safetensors(path, {{"bad\xff", patterned({1}, dtype::u8, 0)}});
  REQUIRE_FALSE(utf8);
  CHECK(contains(utf8.err().message, "UTF-8"));
  CHECK(dir.entries().empty());

  auto missing_dir =
      write_safetensors(dir.file("nope/x.safetensors"), {{"a", patterned({1}, dtype::u8, 0)}});
  REQUIRE_FALSE(missing_dir);
  CHECK(missing_dir.err().code == errc::io);
  CHECK(contains(missing_dir.err().message, dir.file("nope/x.safetensors")));
}

TEST_CASE("a failed write keeps the previous file") {
  scratch_dir dir;
  std::string path = dir.file("keep.safetensors");
  named_tensors good{{"a", patterned({4}, dtype::f32, 1)}};
  REQUIRE(write_safetensors(path, good));
  std::string before = read_raw(path);
  REQUIRE_FALSE(write_safetensors(path, {{"a", patterned({4}, dtype::f32, 2)}, {"b", tensor()}}));
  CHECK(read_raw(path) == before);
  CHECK(dir.entries() == std::vector<std::string>{"keep.safetensors"});
}

TEST_CASE("header-only reader lists names, dtypes and shapes, including dtypes we do not load") {
  std::string header = R"({"a":{"dtype":"F64","shape":[2,2],"data_offsets":[0,32]},)"
                       R"("m":{"dtype":"BOOL","shape":[3],"data_offsets":[32,35]},)"
                       R"("x":{"dtype":"BF16","shape":[1],"data_offsets":[35,37]}})";
  scratch_dir dir;
  std::string path = dir.file("hf.safetensors");
  write_raw(path, safetensors_bytes(header, std::string(37, '\0')));

  auto h = read_safetensors_header(path);
  REQUIRE_MESSAGE(h, h.err().to_string());
  CHECK(h->data_offset == 8 + header.size());
  CHECK(h->data_bytes == 37);
  REQUIRE(h->tensors.size() == 3);
  CHECK(h->tensors.at("a").dtype_tag == "F64");
  CHECK_FALSE(h->tensors.at("a").type.has_value());
  CHECK(h->tensors.at("a").shape == shape_t{2, 2});
  CHECK(h->tensors.at("m").dtype_tag == "BOOL");
  CHECK(h->tensors.at("x").type == dtype::bf16);
  CHECK(h->tensors.at("x").begin == 35);
  CHECK(h->tensors.at("x").end == 37);

  auto full = read_safetensors(path);
  REQUIRE_FALSE(full);
  CHECK(full.err().code == errc::unsupported);
  CHECK(contains(full.err().message, path));
  CHECK(contains(full.err().message, "'a'"));
  CHECK(contains(full.err().message, "F64"));
}

TEST_CASE("check_tensors names the first missing, extra or mis-shaped tensor") {
  named_tensors file{{"a", tensor::empty({2, 3}, dtype::f32)},
                     {"b", tensor::empty({4}, dtype::i64)}};
  std::map<std::string, tensor_spec> specs{{"a", {{2, 3}, dtype::f32}}, {"b", {{4}, dtype::i64}}};
  CHECK(check_tensors("w.safetensors", file, specs));

  auto missing_specs = specs;
  missing_specs["c"] = {{1}, dtype::u8};
  auto missing = check_tensors("w.safetensors", file, missing_specs);
  REQUIRE_FALSE(missing);
  CHECK(missing.err().code == errc::not_found);
  CHECK(contains(missing.err().message, "w.safetensors"));
  CHECK(contains(missing.err().message, "missing tensor 'c'"));

  auto extra_specs = specs;
  extra_specs.erase("a");
  auto extra = check_tensors("w.safetensors", file, extra_specs);
  REQUIRE_FALSE(extra);
  CHECK(contains(extra.err().message, "unexpected tensor 'a'"));

  auto shape_specs = specs;
  shape_specs["a"] = {{3, 2}, dtype::f32};
  auto shape = check_tensors("w.safetensors", file, shape_specs);
  REQUIRE_FALSE(shape);
  CHECK(contains(shape.err().message, "tensor 'a' is f32[2, 3], expected f32[3, 2]"));

  auto type_specs = specs;
  type_specs["b"] = {{4}, dtype::i32};
  auto type = check_tensors("w.safetensors", file, type_specs);
  REQUIRE_FALSE(type);
  CHECK(contains(type.err().message, "tensor 'b' is i64[4], expected i32[4]"));

  // Several problems: the alphabetically first is named.
  std::map<std::string, tensor_spec> many{{"0", {{1}, dtype::u8}}, {"b", {{5}, dtype::i64}}};
  auto first = check_tensors("w.safetensors", file, many);
  REQUIRE_FALSE(first);
  CHECK(contains(first.err().message, "'0'"));
}

TEST_CASE("a streamed write gives the bytes of a whole write, asking for one tensor at a time in name order") {
  scratch_dir dir;
  named_tensors tensors;
  int seed = 0;
  for (dtype type : {dtype::f32, dtype::bf16, dtype::i64})
    for (const shape_t& shape : {shape_t{}, shape_t{0}, shape_t{7}, shape_t{2, 3}})
      tensors[fmt::format("{}.{}", dtype_name(type), shape_string(shape))] = patterned(shape, type, ++seed);
  const metadata_map metadata{{"format", "pt"}};
  REQUIRE(write_safetensors(dir.file("whole.safetensors"), tensors, metadata));
  std::map<std::string, tensor_spec> specs;
  for (const auto& [name, t] : tensors) specs[name] = tensor_spec{t.shape(), t.type()};
  std::vector<std::string> asked;
  REQUIRE(write_safetensors_streamed(dir.file("streamed.safetensors"), specs, metadata,
                                     [&](const std::string& name, const tensor_spec&) -> expected<tensor> {
                                       asked.push_back(name);
                                       return tensors.at(name);
                                     }));
  CHECK(read_raw(dir.file("streamed.safetensors")) == read_raw(dir.file("whole.safetensors")));
  std::vector<std::string> order;
  for (const auto& [name, t] : tensors) order.push_back(name);
  CHECK(asked == order);
  // A tensor that does not match its header entry, or a source that fails, ends the write
  // with an error naming the tensor, and no file appears.
  auto wrong = write_safetensors_streamed(dir.file("bad.safetensors"), specs, metadata,
                                          [&](const std::string& name, const tensor_spec&) -> expected<tensor> {
                                            return name == "i64.[7]" ? patterned({6}, dtype::i64, 1) : tensors.at(name);
                                          });
  REQUIRE_FALSE(wrong);
  CHECK(contains(wrong.err().message, "tensor 'i64.[7]'"));
  auto failed = write_safetensors_streamed(dir.file("bad.safetensors"), specs, metadata,
                                           [&](const std::string&, const tensor_spec&) -> expected<tensor> {
                                             return make_error(errc::io, "source gone");
                                           });
  REQUIRE_FALSE(failed);
  CHECK(contains(failed.err().message, "source gone"));
  CHECK(dir.entries() == std::vector<std::string>{"streamed.safetensors", "whole.safetensors"});
}
