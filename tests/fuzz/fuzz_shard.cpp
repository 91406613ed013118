// libFuzzer target: a pre-training shard (a safetensors file with the shard's metadata and
// six int32 arrays): the load's checks, then every row read back.
#include "io/data/pretrain_shard.hpp"
#include "tests/fuzz/fuzz_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto shard = dsa::data::pretrain_shard::load(dsa::fuzz::as_file(data, size));
  if (!shard) return 0;
  for (std::int64_t i = 0; i < shard->count(); ++i) (void)shard->row(i);
  return 0;
}
