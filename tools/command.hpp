// The dsactor subcommands: each lives in its own file and is listed once in main.cpp.
#pragma once

namespace dsa::tools {

// argv[0] is the subcommand name; returns the process exit code.
using command_fn = int (*)(int argc, char** argv);

int cmd_run(int argc, char** argv);
int cmd_report(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_eval(int argc, char** argv);
int cmd_vocab(int argc, char** argv);
int cmd_prep(int argc, char** argv);
int cmd_launch(int argc, char** argv);
int cmd_convert(int argc, char** argv);
int cmd_nvme_tune(int argc, char** argv);
int cmd_trace(int argc, char** argv);
// In dsactor-bench (tools/bench/main.cpp), which dsactor's cmd_bench and cmd_nvme_tune run:
// the benchmarks (cmd_bench.cpp) and the [aio] sweep (cmd_nvme_tune.cpp).
int bench_command(int argc, char** argv);
int nvme_tune_command(int argc, char** argv);
// 'dsactor prep qa-from-corpus' (tools/cmd_prep_qa.cpp), dispatched by cmd_prep.
int prep_qa_from_corpus(int argc, char** argv);

} // namespace dsa::tools
