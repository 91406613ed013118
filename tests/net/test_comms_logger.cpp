// The comms logger: nccl-tests bandwidth formulas, per (operation, size) totals,
// DeepSpeed's prof_all / prof_ops filtering.
#include "io/net/comms_logger.hpp"

#include <doctest/doctest.h>

using dsa::net::comms_logger;
using dsa::net::comms_logger_options;

TEST_CASE("comms logger: busbw factors are nccl-tests'") {
  CHECK(dsa::net::busbw_factor("all_reduce", 4) == doctest::Approx(1.5));
  CHECK(dsa::net::busbw_factor("all_reduce", 2) == doctest::Approx(1.0));
  CHECK(dsa::net::busbw_factor("all_gather", 4) == doctest::Approx(0.75));
  CHECK(dsa::net::busbw_factor("reduce_scatter", 8) == doctest::Approx(0.875));
  CHECK(dsa::net::busbw_factor("broadcast", 8) == doctest::Approx(1.0));
  CHECK(dsa::net::busbw_factor("all_reduce", 1) == doctest::Approx(1.0));
}

TEST_CASE("comms logger: totals per operation and size, means of the bandwidths") {
  comms_logger_options o;
  o.enabled = true;
  comms_logger log(o, 4);
  log.record("all_reduce", 1000000, 0.001, "reducer 0"); // 1 GB/s alg, 1.5 bus
  log.record("all_reduce", 1000000, 0.002, "reducer 0"); // 0.5 GB/s alg, 0.75 bus
  log.record("all_reduce", 64, 0.0001, "reducer 1");
  log.record("all_gather", 32, 0.0001, "coordinator");
  auto rows = log.rows();
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].op == "all_gather");
  CHECK(rows[1].op == "all_reduce");
  CHECK(rows[1].bytes == 64);
  CHECK(rows[2].bytes == 1000000);
  CHECK(rows[2].count == 2);
  CHECK(rows[2].total_s == doctest::Approx(0.003));
  CHECK(rows[2].algbw_GBps == doctest::Approx(0.75));
  CHECK(rows[2].busbw_GBps == doctest::Approx(1.125));
  CHECK(rows[2].callers.empty()); // only with debug
  const std::string table = log.summary();
  CHECK(table.find("Comm. Op") != std::string::npos);
  CHECK(table.find("976.56 KB") != std::string::npos);
}

TEST_CASE("comms logger: disabled records nothing; prof_all = false keeps only prof_ops; debug names callers") {
  comms_logger off({}, 2);
  off.record("all_reduce", 8, 0.1, "x");
  CHECK(off.rows().empty());
  CHECK(off.summary().empty());

  comms_logger_options o;
  o.enabled = true;
  o.prof_all = false;
  o.prof_ops = {"all_gather"};
  o.debug = true;
  comms_logger some(o, 2);
  CHECK_FALSE(some.profiles("all_reduce"));
  CHECK(some.profiles("all_gather"));
  some.record("all_reduce", 8, 0.1, "reducer 0");
  some.record("all_gather", 8, 0.1, "coordinator");
  some.record("all_gather", 8, 0.1, "coordinator");
  auto rows = some.rows();
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].op == "all_gather");
  CHECK(rows[0].callers == "coordinator x2");
}
