// libFuzzer target: SQuAD v1.1 JSON (the data set) and a predictions file, from one input.
#include "io/data/squad_dataset.hpp"
#include "io/data/squad_eval.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)dsa::data::parse_squad(text, "<fuzz>");
  (void)dsa::data::parse_squad_predictions(text, "<fuzz>");
  return 0;
}
