// The one place a stage's device is chosen; see model_stage.hpp.
#include "actors/train/stage/bert_stage.hpp"
#include "actors/train/stage/model_stage.hpp"

#include "core/error.hpp"

namespace dsa::train {

std::unique_ptr<model_stage> make_stage(stage_device device, const stage_options& options, stage_shared& shared) {
  switch (device) {
  case stage_device::cpu: return std::make_unique<bert_stage>(options, shared);
  }
  DSA_CHECK(false, "make_stage: unknown device {}", static_cast<int>(device));
  return nullptr;
}

} // namespace dsa::train
