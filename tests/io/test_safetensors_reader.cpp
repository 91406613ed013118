// safetensors_reader: tensors and element ranges read on demand equal a whole read,
// only the bytes asked for are read, and bad ranges, sizes and short files are errors
// naming the file and the tensor.
#include "io/ckpt/safetensors_reader.hpp"
#include "tests/io/io_test_util.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>

using namespace dsa;
using namespace dsa::ckpt;
using dsa::test::scratch_dir;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

tensor counting(const shape_t& shape, dtype type) {
  tensor t = tensor::empty(shape, type);
  auto* bytes = static_cast<unsigned char*>(t.raw_data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<unsigned char>(i * 13 + 5);
  return t;
}

} // namespace

TEST_CASE("safetensors_reader reads whole tensors and element ranges, counting the bytes") {
  scratch_dir dir;
  const std::string path = dir.file("a.safetensors");
  named_tensors tensors{{"m", counting({6, 7}, dtype::f32)}, {"h", counting({9}, dtype::bf16)},
                        {"n", counting({2}, dtype::i64)}};
  REQUIRE(write_safetensors(path, tensors).has_value());
  const auto bytes = std::filesystem::file_size(path);
  auto r = safetensors_reader::open(path, bytes);
  REQUIRE_MESSAGE(r.has_value(), r.err().to_string());
  CHECK((*r)->bytes_read() == 0);

  auto whole = (*r)->read("m");
  REQUIRE(whole.has_value());
  CHECK(whole->shape() == shape_t{6, 7});
  CHECK(std::memcmp(whole->raw_data(), tensors["m"].raw_data(), tensors["m"].nbytes()) == 0);
  CHECK((*r)->bytes_read() == 6 * 7 * 4);

  auto part = (*r)->read_range("m", 10, 25);
  REQUIRE(part.has_value());
  CHECK(part->shape() == shape_t{15});
  CHECK(std::memcmp(part->raw_data(), tensors["m"].data<float>() + 10, 15 * 4) == 0);
  auto half = (*r)->read_range("h", 3, 5);
  REQUIRE(half.has_value());
  CHECK(half->type() == dtype::bf16);
  CHECK(std::memcmp(half->raw_data(), static_cast<const char*>(tensors["h"].raw_data()) + 6, 4) == 0);
  CHECK((*r)->bytes_read() == 6 * 7 * 4 + 15 * 4 + 2 * 2);
  CHECK((*r)->read_range("m", 4, 4)->numel() == 0);

  auto past = (*r)->read_range("m", 40, 43);
  REQUIRE_FALSE(past.has_value());
  CHECK(contains(past.err().message, path));
  CHECK(contains(past.err().message, "'m'"));
  auto missing = (*r)->read("x");
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().code == errc::not_found);
  CHECK(contains(missing.err().message, "'x'"));

  auto wrong_size = safetensors_reader::open(path, bytes + 1);
  REQUIRE_FALSE(wrong_size.has_value());
  CHECK(contains(wrong_size.err().message, path));
  CHECK(contains(wrong_size.err().message, "manifest"));

  // Cut after opening: the read that runs past the end names the file and the tensor.
  std::filesystem::resize_file(path, (*r)->header().data_offset + 4);
  auto cut = (*r)->read_range("m", 0, 3);
  REQUIRE_FALSE(cut.has_value());
  CHECK(contains(cut.err().message, path));
  CHECK(contains(cut.err().message, "reading tensor 'm'"));
}
