// The atoms of the dsactor protocol (CAF 0.17: at most 10 characters each).
#pragma once

#include <caf/atom.hpp>

namespace dsa::actors {

using start_atom = caf::atom_constant<caf::atom("start")>; // caller -> coordinator: run
using wire_atom = caf::atom_constant<caf::atom("wire")>;   // coordinator -> actor: peer handles
using tick_atom = caf::atom_constant<caf::atom("tick")>;   // coordinator -> itself: watchdog
using flush_atom = caf::atom_constant<caf::atom("flush")>; // coordinator -> tracer: write the file
using go_atom = caf::atom_constant<caf::atom("go")>;       // coordinator -> feeder: begin producing
using done_atom = caf::atom_constant<caf::atom("done")>;   // coordinator -> caller: run finished; actor -> coordinator: drained
using drain_atom = caf::atom_constant<caf::atom("drain")>; // owner -> nvme engine: finish every request, then stop; coordinator -> actors: answer once every slot written is back
using allow_atom = caf::atom_constant<caf::atom("allow")>; // coordinator -> shard: (allow_atom, k) updates of steps <= k may run

} // namespace dsa::actors
