#pragma once
// The atoms of tepdist's local actor messages (CAF 0.17: at most 10 characters each).

#include <caf/atom.hpp>

namespace tepdist::actors {

using commit_atom = caf::atom_constant<caf::atom("commit")>;
using get_atom = caf::atom_constant<caf::atom("get")>;
using push_atom = caf::atom_constant<caf::atom("push")>;
using role_atom = caf::atom_constant<caf::atom("role")>;
using wire_atom = caf::atom_constant<caf::atom("wire")>;
using peer_atom = caf::atom_constant<caf::atom("peer")>;
using init_atom = caf::atom_constant<caf::atom("init")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using leave_atom = caf::atom_constant<caf::atom("leave")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using job_atom = caf::atom_constant<caf::atom("job")>;    ///< (job_atom, actor): where the router sends job frames
using shards_atom = caf::atom_constant<caf::atom("shards")>;  ///< (shards_atom, actor): where ShardUpdate frames go
using view_atom = caf::atom_constant<caf::atom("view")>;  ///< (view_atom, members): the membership, on every change
using drain_atom = caf::atom_constant<caf::atom("drain")>;  ///< (drain_atom) -> string: the trainer stops at a step boundary
using boot_atom = caf::atom_constant<caf::atom("boot")>;  ///< (boot_atom, boot id): a role lost its state; the node announces a new run
using hang_atom = caf::atom_constant<caf::atom("hang")>;  ///< (hang_atom): fault injection, the trainer blocks its thread a while
using hostcrash_atom = caf::atom_constant<caf::atom("hostcrash")>;  ///< (hostcrash_atom): fault injection, the trainer makes its shard host fail
using dieatend_atom = caf::atom_constant<caf::atom("dieatend")>;  ///< (dieatend_atom): fault injection, rank 0 dies before it completes its job
using monitor_atom = caf::atom_constant<caf::atom("monitor")>;  ///< (monitor_atom, actor): where figure gossip goes; (monitor_atom, MetricsSnapshot): every node's figures, for status answers
using status_atom = caf::atom_constant<caf::atom("status")>;  ///< (status_atom, optional JobStatus): for status answers
using place_atom = caf::atom_constant<caf::atom("place")>;  ///< (place_atom, plan): an async generation's shards, to the shard host
using refetch_atom = caf::atom_constant<caf::atom("refetch")>;  ///< (refetch_atom, generation): the shard host asks again for shards it still fetches
using gather_atom = caf::atom_constant<caf::atom("gather")>;  ///< (gather_atom, id): rank 0's shard host gathers every shard for a checkpoint; (gather_atom, id, result) back
using unfreeze_atom = caf::atom_constant<caf::atom("unfreeze")>;  ///< (unfreeze_atom, generation): the shard host lets its frozen copies go
using regather_atom = caf::atom_constant<caf::atom("regather")>;  ///< (regather_atom, id): the gather asks again for shards not come
using handover_atom = caf::atom_constant<caf::atom("handedover")>;  ///< (handover_atom): the shard host holds every shard of a generation, or a leaving node's shards are all fetched by their new holders
using shardlost_atom = caf::atom_constant<caf::atom("shardlost")>;  ///< (shardlost_atom, why): the shard host cannot get a shard
using release_atom = caf::atom_constant<caf::atom("release")>;  ///< (release_atom, epochs, reset file, checksum, optimiser): the submitter releases epochs of a job that pauses between them

}  // namespace tepdist::actors
