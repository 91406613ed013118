// Stage partitioning of BERT's layer list.
#include "actors/train/config/layer_partition.hpp"

#include "models/bert/parameter_specs.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <regex>

namespace dsa::train {

std::string describe_layout(const std::vector<bert::bert_range>& ranges) {
  std::string out;
  for (const auto& r : ranges) out += (out.empty() ? "" : " | ") + r.to_string();
  return out;
}

expected<std::vector<bert::bert_range>> parse_layout(const std::string& text, const bert::bert_config& cfg) {
  std::vector<bert::bert_range> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t bar = text.find(" | ", at);
    std::string part = text.substr(at, bar == std::string::npos ? std::string::npos : bar - at);
    at = bar == std::string::npos ? text.size() + 1 : bar + 3;
    bert::bert_range r;
    const std::string emb = "embeddings + ", head = " + head";
    const bool with_embeddings = part.rfind(emb, 0) == 0;
    if (with_embeddings) part.erase(0, emb.size());
    const bool with_head = part.size() >= head.size() && part.compare(part.size() - head.size(), head.size(), head) == 0;
    if (with_head) part.erase(part.size() - head.size());
    long long first = -1, last = -1;
    char close = 0;
    int used = 0;
    if (std::sscanf(part.c_str(), "layers [%lld, %lld%c%n", &first, &last, &close, &used) != 3 || close != ')' ||
        static_cast<std::size_t>(used) != part.size())
      return make_error(errc::format, "pipeline layout '{}': stage {} is '{}', expected '[embeddings + ]layers [a, b)[ + head]'",
                        text, out.size(), part);
    r = bert::bert_range::layers(first, last);
    if (with_embeddings) r.with_embeddings();
    if (with_head) r.with_head();
    if (auto ok = r.validate(cfg); !ok)
      return make_error(errc::format, "pipeline layout '{}': {}", text, ok.err().message);
    const bool first_stage = out.empty(), last_stage = at > text.size();
    const std::int64_t from = first_stage ? 0 : out.back().last_layer;
    if (r.first_layer != from || with_embeddings != first_stage || with_head != last_stage ||
        (last_stage && r.last_layer != cfg.num_layers))
      return make_error(errc::format,
                        "pipeline layout '{}': stage {} is '{}'; the stages must cover layers [0, {}) in order, the "
                        "embeddings with the first and the head with the last",
                        text, out.size(), r.to_string(), cfg.num_layers);
    out.push_back(r);
  }
  return out;
}

std::vector<std::size_t> balanced_split(const std::vector<double>& weights, std::size_t parts) {
  const std::size_t n = weights.size();
  DSA_CHECK(parts >= 1 && parts <= n, "cannot split {} items into {} parts", n, parts);
  std::vector<double> prefix(n + 1, 0.0);
  for (std::size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + weights[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][i]: the smallest possible largest run over items [0, i) split into k runs.
  std::vector<std::vector<double>> best(parts + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<std::size_t>> cut(parts + 1, std::vector<std::size_t>(n + 1, 0));
  best[0][0] = 0.0;
  for (std::size_t k = 1; k <= parts; ++k)
    for (std::size_t i = k; i <= n; ++i)
      for (std::size_t j = k - 1; j < i; ++j) {
        double v = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (v < best[k][i]) {
          best[k][i] = v;
          cut[k][i] = j;
        }
      }
  std::vector<std::size_t> starts(parts);
  for (std::size_t k = parts, i = n; k >= 1; --k) {
    starts[k - 1] = cut[k][i];
    i = cut[k][i];
  }
  return starts;
}

expected<std::vector<bert::bert_range>> partition_layers(const bert::bert_config& cfg, std::uint32_t stages,
                                                         const std::string& method) {
  const std::int64_t L = cfg.num_layers;
  if (stages < 1 || static_cast<std::int64_t>(stages) > L)
    return make_error(errc::config, "pipeline.stages = {}: must be between 1 and the number of layers ({})", stages, L);
  // Items: embeddings, L layers, head; the embeddings and head ride with their neighbours.
  std::vector<double> weights(static_cast<std::size_t>(L), 1.0);
  std::optional<std::vector<std::size_t>> explicit_starts; // layers:<counts>
  if (method == "parameters") {
    auto count = [&](const bert::bert_range& r) {
      return static_cast<double>(bert::parameter_count(bert::parameter_specs(cfg, r)));
    };
    for (std::int64_t l = 0; l < L; ++l) weights[static_cast<std::size_t>(l)] = count(bert::bert_range::layers(l, l + 1));
    weights.front() += count(bert::bert_range::layers(0, 0).with_embeddings());
    weights.back() += count(bert::bert_range::layers(L, L).with_head());
  } else if (method.rfind("type:", 0) == 0) {
    std::regex re;
    try {
      re = std::regex(method.substr(5), std::regex::icase);
    } catch (const std::regex_error& e) {
      return make_error(errc::config, "pipeline.partition = '{}': bad regular expression: {}", method, e.what());
    }
    if (!std::regex_search("BertLayer", re))
      return make_error(errc::config, "pipeline.partition = '{}': matches no encoder layer (layer names: BertLayer)",
                        method);
  } else if (method.rfind("layers:", 0) == 0) {
    // Encoder layers per stage, as given (a partition chosen by measured time, say).
    std::vector<std::size_t> starts;
    std::int64_t next = 0;
    std::size_t at = 7;
    while (at <= method.size()) {
      const std::size_t comma = std::min(method.find(',', at), method.size());
      const std::string item = method.substr(at, comma - at);
      std::size_t used = 0;
      long long n = -1;
      try {
        n = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != item.size() || item.empty() || n < 1)
        return make_error(errc::config, "pipeline.partition = '{}': '{}' is not a layer count of at least 1", method,
                          item);
      starts.push_back(static_cast<std::size_t>(next));
      next += n;
      at = comma + 1;
    }
    if (starts.size() != stages || next != L)
      return make_error(errc::config,
                        "pipeline.partition = '{}': {} counts summing to {}; expected {} (pipeline.stages) summing to "
                        "{} (the model's layers)",
                        method, starts.size(), next, stages, L);
    explicit_starts = std::move(starts);
  } else if (method != "uniform") {
    return make_error(errc::config,
                      "pipeline.partition = '{}': expected 'uniform', 'parameters', 'type:<regex>' or "
                      "'layers:<n0>,<n1>,...'",
                      method);
  }
  auto starts = explicit_starts ? *explicit_starts : balanced_split(weights, stages);
  std::vector<bert::bert_range> ranges;
  for (std::uint32_t s = 0; s < stages; ++s) {
    std::int64_t first = static_cast<std::int64_t>(starts[s]);
    std::int64_t last = s + 1 < stages ? static_cast<std::int64_t>(starts[s + 1]) : L;
    bert::bert_range r = bert::bert_range::layers(first, last);
    if (s == 0) r.with_embeddings();
    if (s + 1 == stages) r.with_head();
    ranges.push_back(r);
  }
  return ranges;
}

} // namespace dsa::train
