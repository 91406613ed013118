// The quick start's data step: when the vocabulary or the shards named by
// [data.prepare] are absent, build them from the corpus (the same library
// steps as `dsactor vocab build` and `dsactor prep pretrain`). Files already
// present are kept, so a second run starts training at once.
#pragma once

#include "actors/train/config/run_config.hpp"
#include "core/error.hpp"

#include <string>
#include <vector>

namespace dsa::train {

status prepare_pretraining_data(const prepare_settings& p, const std::string& vocab_path);
// train.json and dev.json in p.out_dir from the corpus, when absent.
status prepare_qa_data(const prepare_qa_settings& p);

// Shard files of a data set: every *.safetensors in a directory, or, when `spec` is
// "<dir>/<prefix>", the files <dir>/<prefix>-*.safetensors; sorted by name.
expected<std::vector<std::string>> list_shards(const std::string& spec);

} // namespace dsa::train
