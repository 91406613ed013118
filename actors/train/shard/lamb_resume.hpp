// 1-bit LAMB's per-tensor state (its trust-ratio coefficient and factor, momentum scaling and
// fresh variance) across pipeline layouts. A checkpoint keeps it indexed by the saved stage's
// parameter order, in one of two forms: a ZeRO run's group checkpoint_lamb_group(s)
// (partitioned_optimizer::lamb_state: "coeff", "factor", "scaling" in the stage's parameter
// order, "<name>.exp_avg_sq_fresh" per tensor) or a whole shard's optimizer group
// ("compressed.all.<field>", decay tensors first, the fresh variance flat). Resuming on
// another layout reads each saved stage's in either form, keys it by parameter name, and
// hands each new stage lamb_state's form for its own parameters.
#pragma once

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "models/bert/parameter_specs.hpp"

#include <map>
#include <string>
#include <vector>

namespace dsa::train {

// A whole shard's optimizer group (its "compressed.all.*" entries) in lamb_state's form for
// the stage of `specs`; empty when the group holds none.
expected<std::map<std::string, tensor>> lamb_state_of_group(const std::vector<bert::param_spec>& specs,
                                                            const std::map<std::string, tensor>& optimizer_group);

struct saved_lamb_stage {
  std::vector<bert::param_spec> specs;      // the saved stage's parameters, in its order
  std::map<std::string, tensor> lamb_state; // lamb_state's form for them
};

// lamb_state's form for the stage of `specs` from the saved stages' (the first that holds a
// name gives it: a tied weight's copies agree). Every name must be held by one saved stage.
expected<std::map<std::string, tensor>> repartition_lamb_state(const std::vector<saved_lamb_stage>& saved,
                                                               const std::vector<bert::param_spec>& specs);

} // namespace dsa::train
