// `dsactor bench runtime`: the actor runtime's own overhead on a BERT-mini
// step (one stage, M micro-batches) against the same calls in a plain loop,
// and the cost of trace recording.
#pragma once

namespace dsa::tools {

int bench_runtime_main(int argc, char** argv);

} // namespace dsa::tools
