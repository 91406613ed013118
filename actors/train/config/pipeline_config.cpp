// See pipeline_config.hpp.
#include "actors/train/config/pipeline_config.hpp"

#include "optim/param_reader.hpp"

#include <fmt/format.h>

#include <cstdint>

namespace dsa::train {

void read_pipeline(const config& cfg, run_config& rc, config_problems& problems) {
  optim::param_reader r(cfg, "pipeline", problems);
  std::int64_t stages = 1;
  r.read("stages", stages);
  r.read("partition", rc.partition);
  r.read("schedule", rc.schedule);
  r.read("speculative_update", rc.speculative_update);
  r.read("max_deferred_w", rc.max_deferred_w);
  r.check_unknown();
  if (stages < 1 || stages > 64)
    r.invalid("stages", fmt::format("must be in 1..64, got {}", stages));
  if (rc.schedule != "1f1b" && rc.schedule != "gpipe" && rc.schedule != "zb")
    r.invalid("schedule", fmt::format("expected '1f1b', 'gpipe' or 'zb', got '{}'", rc.schedule));
  if (rc.max_deferred_w < 0 || rc.max_deferred_w > 1024)
    r.invalid("max_deferred_w", fmt::format("must be in 0..1024 (0: the number of stages), got {}", rc.max_deferred_w));
  if (rc.max_deferred_w != 0 && rc.schedule != "zb")
    r.invalid("max_deferred_w", fmt::format("bounds the zero-bubble schedule's deferred W work: it needs "
                                            "pipeline.schedule = \"zb\" (got \"{}\")",
                                            rc.schedule));
  rc.stages = static_cast<std::uint32_t>(stages);
  if (rc.max_deferred_w == 0) rc.max_deferred_w = rc.stages;
}

actors::schedule_kind schedule_kind_of(const run_config& rc) {
  if (rc.schedule == "gpipe") return actors::schedule_kind::gpipe;
  if (rc.schedule == "zb") return actors::schedule_kind::zero_bubble;
  return actors::schedule_kind::one_f_one_b;
}

} // namespace dsa::train
