// Small helpers shared by the benchmarks: best-of-N wall-clock timing, medians, the CPU's name,
// a made-up corpus for runs whose text does not matter.
#pragma once

#include "core/philox.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace dsa::tools {

// Runs `body` once to warm up, then `reps` times; returns the best time in seconds.
inline double best_seconds(int reps, const std::function<void()>& body) {
  body();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    body();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s < best) best = s;
  }
  return best;
}

// The median of `v` (the mean of the middle two for an even count; 0 when empty).
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The CPU's model name from /proc/cpuinfo ("unknown" without one): every figure a
// benchmark records is named with it.
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

// The end of a benchmark's run config: one evaluation batch, the data prepared from
// `corpus` into WORK/data (a 400-token vocabulary, sequences of `seq` tokens), and
// checkpoints in `checkpoints` without a final save.
inline std::string prepared_data_sections(const std::string& corpus, const std::string& work, std::int64_t seq,
                                          const std::string& checkpoints) {
  return fmt::format(R"([data]
eval_batches = 1

[data.prepare]
corpus = "{}"
out_dir = "{}/data"
vocab_size = 400
seq_length = {}
max_predictions = {}
dupe_factor = 2
holdout_docs = 1

[checkpoint]
dir = "{}"
save_final = false
)",
                     corpus, work, seq, std::max<std::int64_t>(2, seq * 15 / 100), checkpoints);
}

// Plain-text documents of made-up words (syllable pairs), enough for the run's
// sequences; the content does not matter to the timing.
inline std::string write_corpus(const std::string& dir, int documents) {
  static const char* syllables[] = {"ka",  "lo",  "mi", "ren", "tu",  "sa", "vel",
                                    "dor", "pi",  "an", "gre", "mo",  "ti", "bal",
                                    "un",  "ser", "fo", "lin", "qua", "zet"};
  constexpr std::uint64_t n = sizeof syllables / sizeof syllables[0];
  const std::string corpus = dir + "/corpus";
  std::filesystem::create_directories(corpus);
  philox_stream rng{2024, 0, 0, 0, 0};
  std::uint64_t k = 0;
  auto pick = [&] { return static_cast<std::uint64_t>(rng.uniform(k++) * n) % n; };
  for (int d = 0; d < documents; ++d) {
    std::ofstream out(fmt::format("{}/doc{:03}.txt", corpus, d));
    for (int s = 0; s < 30; ++s) {
      const int words = 6 + static_cast<int>(pick() % 12);
      for (int w = 0; w < words; ++w)
        out << (w ? " " : "") << syllables[pick()] << syllables[pick()];
      out << ".\n";
    }
  }
  return corpus;
}

// A made-up SQuAD v1.1 training set for timing fine-tuning steps: `examples` questions,
// each with its own context of words of two syllables (one window at max_seq_length:
// about seq * 3 / 4 words, a question of 12), the answer a span of 3 context words; and a
// vocabulary holding BERT's special tokens and every such word. Writes dir/qa-train.json
// and dir/qa-vocab.txt; returns dir.
inline std::string write_squad_set(const std::string& dir, int examples, std::int64_t seq) {
  static const char* syllables[] = {"ka",  "lo",  "mi", "ren", "tu",  "sa", "vel",
                                    "dor", "pi",  "an", "gre", "mo",  "ti", "bal",
                                    "un",  "ser", "fo", "lin", "qua", "zet"};
  constexpr std::uint64_t n = sizeof syllables / sizeof syllables[0];
  std::filesystem::create_directories(dir);
  {
    std::ofstream vocab(dir + "/qa-vocab.txt");
    vocab << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
    for (std::uint64_t a = 0; a < n; ++a)
      for (std::uint64_t b = 0; b < n; ++b)
        vocab << syllables[a] << syllables[b] << "\n";
  }
  philox_stream rng{2025, 0, 0, 0, 0};
  std::uint64_t k = 0;
  auto word = [&] {
    const auto a = static_cast<std::uint64_t>(rng.uniform(k++) * n) % n;
    const auto b = static_cast<std::uint64_t>(rng.uniform(k++) * n) % n;
    return std::string(syllables[a]) + syllables[b];
  };
  const std::int64_t context_words = std::max<std::int64_t>(8, seq * 3 / 4 - 16);
  std::string json = R"({"version": "1.1", "data": [{"title": "made-up", "paragraphs": [)";
  for (int e = 0; e < examples; ++e) {
    std::string context, answer, question;
    std::size_t answer_start = 0;
    const std::int64_t at = static_cast<std::int64_t>(rng.uniform(k++) * static_cast<float>(context_words - 3));
    for (std::int64_t w = 0; w < context_words; ++w) {
      if (w)
        context += ' ';
      if (w == at)
        answer_start = context.size();
      const std::string x = word();
      context += x;
      if (w >= at && w < at + 3)
        answer += (answer.empty() ? "" : " ") + x;
    }
    for (int w = 0; w < 12; ++w)
      question += (w ? " " : "") + word();
    json += fmt::format(R"({}{{"context": "{}", "qas": [{{"id": "q{}", "question": "{}", "answers": [{{"text": "{}", "answer_start": {}}}]}}]}})",
                        e ? ", " : "", context, e, question, answer, answer_start);
  }
  json += "]}]}\n";
  std::ofstream(dir + "/qa-train.json") << json;
  return dir;
}

} // namespace dsa::tools
