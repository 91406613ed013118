// `dsactor trace hang RUN`: where a hang began, from the flight records the processes wrote
// into their traces (io/net/flight_recorder.hpp: on the watchdog, a lost peer, SIGUSR1 or a
// stop signal). Collectives are lined up by group (channel and world ranks) and call
// number: the first call some member did not finish is where the ranks diverged, and the
// report says which rank never entered it (stalled before it, or skipped it and went on),
// which ranks wait in it and for how long, or which ranks issued different collectives
// there. Pipeline edges between processes compare what one side sent with what the other
// received. Each process's first record counts (the state when the hang was first seen:
// the watchdog's or a lost peer's capture comes before the stop signals that follow), or
// with `last` its last (after several SIGUSR1 of a run that hangs later).
#pragma once

#include "actors/trace/analysis/trace_summary.hpp"
#include "core/error.hpp"
#include "io/net/flight_recorder.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::actors {

// One process's flight record as read from its trace.
struct hang_input {
  std::int32_t rank = -1; // world rank
  std::string path;       // its trace file
  std::size_t records = 0; // flight records in the file
  bool last = false;       // the last of them is used, else the first
  std::vector<std::string> reasons; // every record's reason, in the order written (several records)
  std::string problem;     // the record does not decode: listed, left out of the analysis
  net::flight_record record;
};

struct hang_finding {
  std::uint32_t channel = 0;
  std::vector<std::int32_t> group; // world ranks
  std::uint64_t seq = 0;           // the call where the ranks diverged
  std::string op;                  // its kind, as the ranks that entered it name it
  std::int64_t bytes = 0;
  std::vector<std::int32_t> culprits; // ranks that never entered it, or disagree about it
  // Whether some culprit is not itself waiting in another group's call: where a chain of
  // waits ends (the verdict prefers such a finding to one whose culprits are victims).
  bool root = true;
  std::vector<std::int32_t> victims; // ranks that never entered it because they wait in another call
  double waited_s = 0; // the longest any member waited in it
  std::vector<std::string> lines; // per member: what it did there
  std::string verdict; // one sentence naming the rank(s) and the operation
};

struct hang_edge {
  std::uint32_t edge = 0;
  std::int32_t from = 0, to = 0; // world ranks
  std::uint64_t sent = 0, received = 0;
  std::uint32_t last_sent_step = 0, last_sent_micro = 0, last_received_step = 0, last_received_micro = 0;
  // Slots the consumer (`to`) gave back, and those the producer (`from`) got back.
  std::uint64_t credits_returned = 0, credits_back = 0;
  bool sender_recorded = false, receiver_recorded = false;
  std::string line;
};

struct hang_report {
  std::vector<std::string> records; // per process: its record's reason and time
  std::vector<hang_finding> findings; // the longest wait first
  std::vector<hang_edge> edges;
  std::string verdict; // the first finding's, or why there is none
};

// The inputs of a run directory's (or a trace file's) traces, one per process file.
// errc::not_found when no trace holds a flight record.
expected<std::vector<hang_input>> hang_inputs(const std::vector<rank_trace>& traces, bool last = false);
hang_report analyse_hang(const std::vector<hang_input>& inputs);
std::string format_hang(const hang_report& report);

// The runtime's name for a communicator channel (actors/data_parallel.hpp's numbering).
std::string channel_role(std::uint32_t channel);

} // namespace dsa::actors
