// dsactor bench pipeline: the 1F1B and zero-bubble schedules measured on real runs of
// pipeline stages in separate processes (2 processes of one thread each, `dsactor launch`),
// interleaved, several runs each: samples/s and the bubble (each stage's idle share of the
// steps' windows, from the joined traces) beside what theory gives, for M = 4 and 8. The
// split between the stages is chosen by measured time first. The last line is one JSON object.
#pragma once

namespace dsa::tools {

int bench_pipeline_main(int argc, char** argv);

} // namespace dsa::tools
