// `dsactor bench compressed`: BERT pre-training with data-parallel ranks, once per
// optimizer (AdamW, 1-bit Adam, 0/1 Adam, Lamb, 1-bit LAMB), held-out MLM loss, bytes on
// the wire and step time side by side.
#pragma once

namespace dsa::tools {

int bench_compressed_main(int argc, char** argv);

} // namespace dsa::tools
