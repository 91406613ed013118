// Test-only faults aimed at one phase of a step, for the chaos drill
// (tests/integration/chaos_drill.py). DSA_TEST_KILL_IN="MARKER:PROCESS:PHASE:STEP" (several
// joined by commas): process PROCESS of a launched job kills itself (SIGKILL) the first time
// it enters PHASE once it has begun step STEP's forward (`commit`: the checkpoint of step STEP
// or later, staged and about to be renamed into place), if the file MARKER does not exist
// yet; the marker is created first, so a restarted job runs on. Phases: forward (a stage's
// forward of a micro-batch), allreduce (a data-parallel reduction entered: allreduce or
// reduce-scatter), commit, swap (a transfer to or from the NVMe swap files submitted).
// Unset, `at` costs one load of a flag.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dsa::test_fault {

enum class phase { forward, allreduce, commit, swap };

// This process's index in its launched job (before it is set, no fault fires). Throws
// std::runtime_error naming DSA_TEST_KILL_IN when the variable does not parse.
void set_process(int process);

// The process enters `p`; `step` (when known there, else -1) is the step it works on.
void at(phase p, std::int64_t step = -1);

// Creates `marker`; false when it exists (the fault it guards fired before).
bool claim(const std::string& marker);

// The test-only fault variables' common form: specs joined by commas, each MARKER (a path,
// colons allowed) then `fields` colon-separated fields: each spec's marker and fields, or
// nullopt for a spec that does not have that form (an empty marker or field included).
std::optional<std::vector<std::vector<std::string>>> split_fault_specs(const std::string& value, std::size_t fields);

} // namespace dsa::test_fault
