// GlooCrossHostMesh: the CrossHostMesh (daemon/core/rendezvous.h) that runs a
// mesh's ops across its hosts over two Gloo contexts (TCP, full mesh each):
// transfers of 256 KiB or more to a higher rank go over the first, to a
// lower rank over the second, so that both directions of a link move at
// once (over one context they take turns); headers and smaller transfers go
// over the first.
//
// Design:
//  - One worker thread per mesh. Start queues the op and returns; the worker
//    runs the ops in order and calls each op's done exactly once.
//  - Header exchange: every op (barriers and ops of no bytes included) first
//    sends a fixed-size signature of the op to every other host and receives
//    theirs (the receive of each host's next header is posted as soon as
//    the last one came: Gloo sends only to a posted receive): sequence,
//    kind, dtypes, byte sizes, group size and count, root, member count,
//    the chain's chunk size, a 64-bit FNV-1a hash of the rest of the plan
//    (groups, permutation, axes, shapes, ...), the plan's signature text and, when
//    this host's verdict is not OK, a flag and its text (truncated). When a
//    host refused the op or the signatures differ, every host fails the op
//    alike with FAILED_PRECONDITION naming the hosts, broken=false: nobody
//    moved data and the connections stay usable; except when the hosts'
//    sequences or wire formats differ, which no later op would mend:
//    broken=true then. For a barrier the header exchange is the whole op.
//    Headers are received into 4 KiB (a header must never grow past it) and
//    their magic, version and size, which lead in every version from 5 on,
//    are checked before anything else is read: a host of another such build
//    (version 6 on: version 5 connects one context under other store keys,
//    so against it the connect times out naming the keys it waited for) is
//    named as such instead of making Gloo end this process with a message
//    longer than its receive. The check is what keeps the data
//    phase safe: a slot whose sender and receiver disagree on its size makes
//    Gloo's device thread throw (gloo::EnforceNotMet), which ends the
//    process; the hash covers the mesh's layout of members on hosts too, so
//    matching headers mean the same schedule on every host.
//  - Data: RunSpanning (daemon/exec/spanning.h) with one partition per host
//    (a member's partition is its host's rank). Every host runs the same
//    deterministic schedule over the global member table and a GlooFabric
//    does only this host's part of it: its local runs and copies, sends of
//    its bytes and receives into its memory; the rest is skipped. The
//    reductions whose members sit on the hosts in contiguous runs take the
//    chain schedule (each host combines its own members, one running result
//    crosses each link, pipelined in chunks, in the group's order), the
//    others the lanes or replication.
//  - Slots: every op's header goes on one slot (1 << 63), so that hosts at
//    different sequences still meet there (a mesh's ops run one at a time,
//    and Gloo matches one pair's messages of a slot in order); op `s`'s data
//    uses (s << 24) | n for n = 1, 2, ... for every transfer of the schedule
//    in order (counted on every host, local or not), so two ops' data never
//    match each other.
//  - Placeholder regions: the members of other hosts (and their scratch)
//    have no memory here; they get addresses inside a PROT_NONE,
//    MAP_NORESERVE mapping of max(in_bytes, out_bytes, 1) bytes, so that the
//    schedule's pointer arithmetic stays valid and an accidental access
//    faults loudly instead of touching real memory.
//  - Failures: a Gloo error while waiting on a transfer to or from rank r
//    names r's host id: a timeout is DEADLINE_EXCEEDED ("host <id> did not
//    take part within the op timeout"), anything else ABORTED ("host <id>:
//    connection lost"); both broken=true, and the mesh then fails later ops
//    at once (the engine breaks it). In the header exchange every host whose
//    header has not come at the deadline is named; in the data phase the
//    first transfer that fails names its peer.
//    Abort aborts the waits in flight (ABORTED with the reason), and the
//    worker then drops the header receives and destroys the Gloo contexts,
//    closing the connections, so the
//    other hosts' ops fail with "connection lost" instead of waiting for
//    their deadline. No Gloo exception escapes a thread.
//  - Traffic: this host's share: the Traffic of its local executor runs,
//    plus the bytes it sent through Gloo (read) and received (written), and
//    its local copies (read and written).
//
// Wire format: the header is a trivially copyable struct sent as bytes;
// every host of a mesh runs the same build on the same architecture.
#ifndef COLLECTIVED_DAEMON_CLUSTER_GLOO_MESH_H_
#define COLLECTIVED_DAEMON_CLUSTER_GLOO_MESH_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/core/rendezvous.h"

namespace gloo::rendezvous {
class Store;
}  // namespace gloo::rendezvous

namespace collectived {

struct GlooMeshOptions {
  // The chain's chunk (SpanningOptions::chain_chunk_bytes). On one machine
  // with few cores large chunks are fastest (each chunk is a round trip of
  // every host's worker); on a network smaller ones overlap more.
  uint64_t chunk_bytes = uint64_t{4} << 20;
  // Reductions smaller than this are replicated (every host gets the inputs
  // it lacks and reduces them all, in group order: one exchange) instead of
  // cut into lanes or chained (two exchanges or more): below it the number
  // of exchanges, not the bytes, sets an op's time (SpanningOptions::
  // lanes_min_bytes). On loopback with 4 hosts on 2 cores, 1-64 KiB psums
  // took a median of 0.9-1.3 ms replicated against 1.1-5 ms in lanes.
  uint64_t replicate_below_bytes = 64 * 1024;
  // Host scratch an idle mesh keeps for its next op (fresh pages cost a
  // fault and zeroing each).
  uint64_t scratch_keep_bytes = uint64_t{128} << 20;
};

// Creates the mesh's Gloo contexts: rank topology.self of
// topology.hosts.size(), TCP devices bound to `bind_host` (an IP or host
// name of this host; the ports are chosen by the kernel), rendezvous through
// `store` under "c0/" and "c1/" (the caller gives it a prefix unique to the
// mesh and generation),
// within `timeout` (also Gloo's default timeout for the context). Errors:
// DEADLINE_EXCEEDED when the peers did not connect in time, UNAVAILABLE
// otherwise, with Gloo's message; INVALID_ARGUMENT for a bad topology.
absl::StatusOr<std::unique_ptr<CrossHostMesh>> ConnectGlooMesh(gloo::rendezvous::Store& store,
                                                               const MeshTopology& topology,
                                                               const std::string& bind_host,
                                                               std::chrono::milliseconds timeout,
                                                               const GlooMeshOptions& options = {});

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_GLOO_MESH_H_
