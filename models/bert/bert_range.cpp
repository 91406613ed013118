// Validation of a pipeline stage's slice of BERT.
#include "models/bert/bert_range.hpp"

#include <fmt/format.h>

namespace dsa::bert {

bert_range bert_range::whole(const bert_config& cfg) {
  return bert_range::layers(0, cfg.num_layers).with_embeddings().with_head();
}

bert_range bert_range::layers(std::int64_t first, std::int64_t last) {
  bert_range r;
  r.first_layer = first;
  r.last_layer = last;
  return r;
}

status bert_range::validate(const bert_config& cfg) const {
  if (first_layer < 0 || last_layer < first_layer || last_layer > cfg.num_layers)
    return make_error(errc::invalid_argument, "bert range {}: layers outside [0, {}]", to_string(),
                      cfg.num_layers);
  if (has_embeddings() && first_layer != 0)
    return make_error(errc::invalid_argument, "bert range {}: embeddings need first_layer 0",
                      to_string());
  if (has_head() && last_layer != cfg.num_layers)
    return make_error(errc::invalid_argument, "bert range {}: the head needs last_layer {}",
                      to_string(), cfg.num_layers);
  if (layer_count() == 0 && !has_embeddings() && !has_head())
    return make_error(errc::invalid_argument, "bert range {}: empty", to_string());
  return {};
}

std::string bert_range::to_string() const {
  return fmt::format("{}layers [{}, {}){}", has_embeddings() ? "embeddings + " : "", first_layer,
                     last_layer, has_head() ? " + head" : "");
}

} // namespace dsa::bert
