// Accepts a DeepSpeed JSON config: its keys become TOML keys of the same names.
#pragma once

#include "core/config.hpp"
#include "core/error.hpp"

#include <string>

namespace dsa::train {

// Reads a DeepSpeed JSON file into a TOML table (objects -> tables, arrays,
// numbers, strings, booleans; null values are dropped, as "unset").
expected<toml::table> load_deepspeed_json(const std::string& path);

// Loads a run config: the TOML file, merged over the DeepSpeed JSON it names with
// `deepspeed_config` (or `json_override`, from --deepspeed_config), TOML keys winning;
// an optimizer or scheduler section of another `type` than the TOML's is dropped
// whole. Errors about keys from the JSON name the JSON file.
expected<config> load_run_config(const std::string& toml_path, const std::string& json_override = "");

} // namespace dsa::train
