// Embedding gather copies rows exactly (widening f16/bf16 tables); scatter-add with repeated ids
// matches the double reference and is bit-identical to in-order f32 accumulation; bad ids abort.
#include "kernels/cpu/embedding.hpp"
#include "tests/support/isa_paths.hpp"

#include "core/half.hpp"

#include "tests/support/compare.hpp"
#include "tests/support/random.hpp"
#include "tests/support/tolerances.hpp"

#include <doctest/doctest.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

using namespace dsa;

namespace {

using test::random_vector;

std::vector<std::int32_t> random_ids(std::int64_t tokens, std::int64_t vocab, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(tokens));
  for (auto& id : ids)
    id = static_cast<std::int32_t>(gen() % static_cast<std::uint32_t>(vocab));
  return ids;
}

struct sizes {
  std::int64_t tokens, vocab, c;
};
// Small vocabularies against many tokens force repeated ids; the last takes the parallel path.
const sizes awkward[] = {{1, 1, 1}, {7, 3, 13}, {37, 11, 100}, {129, 5, 769}, {1031, 29, 64}};

// Runs fn in a child process; true when the child dies of SIGABRT (a DSA_CHECK).
template <class Fn> bool aborts(Fn fn) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    std::signal(SIGABRT, SIG_DFL); // not doctest's crash reporter
    if (!std::freopen("/dev/null", "w", stderr))
      _exit(2); // the expected message is noise
    fn();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

} // namespace

TEST_CASE("embedding: forward copies the table rows of the ids") {
  for (auto [tokens, vocab, c] : awkward) {
    CAPTURE(tokens);
    CAPTURE(c);
    const auto table = random_vector(vocab * c, -1.0f, 1.0f, 1);
    const auto ids = random_ids(tokens, vocab, 2);
    std::vector<float> y(static_cast<std::size_t>(tokens * c));
    cpu::embedding_forward(y.data(), table.data(), ids.data(), tokens, vocab, c);
    std::int64_t wrong = 0;
    for (std::int64_t t = 0; t < tokens; ++t)
      for (std::int64_t j = 0; j < c; ++j)
        wrong += y[static_cast<std::size_t>(t * c + j)] !=
                 table[static_cast<std::size_t>(ids[t] * c + j)];
    CHECK(wrong == 0);
  }
}

TEST_CASE("embedding: forward from an f16/bf16 table widens the rows of the ids exactly") {
  for (dtype t : {dtype::f16, dtype::bf16}) {
    for (auto [tokens, vocab, c] : awkward) {
      CAPTURE(dtype_name(t));
      CAPTURE(tokens);
      CAPTURE(c);
      const auto values = random_vector(vocab * c, -1.0f, 1.0f, 8);
      std::vector<std::uint16_t> table(values.size());
      for (std::size_t i = 0; i < values.size(); ++i)
        table[i] = t == dtype::f16 ? f32_to_f16(values[i]) : f32_to_bf16(values[i]);
      const auto ids = random_ids(tokens, vocab, 9);
      for (cpu::isa path : test::isa_paths()) {
        CAPTURE(cpu::isa_name(path));
        std::vector<float> y(static_cast<std::size_t>(tokens * c));
        cpu::embedding_forward(path, y.data(), table.data(), t, ids.data(), tokens, vocab, c);
        std::int64_t wrong = 0;
        for (std::int64_t i = 0; i < tokens * c; ++i) {
          const std::uint16_t h = table[static_cast<std::size_t>(ids[i / c] * c + i % c)];
          wrong += y[static_cast<std::size_t>(i)] != (t == dtype::f16 ? f16_to_f32(h) : bf16_to_f32(h));
        }
        CHECK(wrong == 0);
      }
    }
  }
}

TEST_CASE("embedding: backward scatter-adds repeated ids like the double reference") {
  for (auto [tokens, vocab, c] : awkward) {
    CAPTURE(tokens);
    CAPTURE(c);
    const auto dy = random_vector(tokens * c, -1.0f, 1.0f, 3);
    const auto ids = random_ids(tokens, vocab, 4);
    auto dtable = random_vector(vocab * c, -1.0f, 1.0f, 5); // += onto prior values
    std::vector<double> want(dtable.begin(), dtable.end());
    std::vector<float> in_order = dtable;
    for (std::int64_t t = 0; t < tokens; ++t)
      for (std::int64_t j = 0; j < c; ++j) {
        const auto dst = static_cast<std::size_t>(ids[t] * c + j),
                   src = static_cast<std::size_t>(t * c + j);
        want[dst] += dy[src];
        in_order[dst] += dy[src];
      }
    for (cpu::isa path : test::isa_paths()) {
      CAPTURE(cpu::isa_name(path));
      auto got = dtable;
      cpu::embedding_backward(path, got.data(), dy.data(), ids.data(), tokens, vocab, c);
      DSA_CHECK_CLOSE(got.data(), want.data(), vocab * c, test::f32_kernel);
      CHECK(got == in_order); // deterministic: tokens are added in order, whatever the threads or path
    }
  }
}

TEST_CASE("embedding: backward is bit-identical across thread counts") {
  const std::int64_t tokens = 1031, vocab = 29, c = 100;
  const auto dy = random_vector(tokens * c, -1.0f, 1.0f, 6);
  const auto ids = random_ids(tokens, vocab, 7);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 5}) {
    omp_set_num_threads(threads);
    std::vector<float> dtable(static_cast<std::size_t>(vocab * c), 0.0f);
    cpu::embedding_backward(dtable.data(), dy.data(), ids.data(), tokens, vocab, c);
    results.push_back(dtable);
  }
  omp_set_num_threads(saved);
  CHECK(results[1] == results[0]);
  CHECK(results[2] == results[0]);
}

TEST_CASE("embedding: an id outside [0, vocab) is a failed check") {
  const std::int64_t vocab = 5, c = 3;
  std::vector<float> table(static_cast<std::size_t>(vocab * c), 1.0f), y(2 * c);
  for (std::int32_t bad : {-1, 5}) {
    CAPTURE(bad);
    const std::vector<std::int32_t> ids{0, bad};
    CHECK(aborts([&] { cpu::embedding_forward(y.data(), table.data(), ids.data(), 2, vocab, c); }));
    CHECK(
        aborts([&] { cpu::embedding_backward(table.data(), y.data(), ids.data(), 2, vocab, c); }));
  }
  const std::vector<std::int32_t> good{0, 4};
  CHECK_FALSE(
      aborts([&] { cpu::embedding_forward(y.data(), table.data(), good.data(), 2, vocab, c); }));
}
