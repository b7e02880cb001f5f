// HostMesh: the CrossHostMesh (daemon/core/rendezvous.h) that runs a mesh's
// ops across its hosts over the mesh generation's HostTransport
// (host_transport.h: authenticated TCP, TLS where configured), two
// connections (lanes) per pair of hosts: transfers of 256 KiB or more to a
// higher rank go over lane 0, to a lower rank over lane 1, so that both
// directions of a link move at once on an I/O thread each; headers and
// smaller transfers go over lane 0.
//
// Design:
//  - One worker thread per mesh. Start queues the op and returns; the worker
//    runs the ops in order and calls each op's done exactly once.
//  - Header exchange: every op (barriers and ops of no bytes included) first
//    sends a fixed-size signature of the op to every other host and receives
//    theirs (the receive of each host's next header is posted as soon as
//    the last one came, so a host's header goes out the moment it starts
//    the op): sequence, kind, dtypes, byte sizes, group size and count, root,
//    member count, the chain's chunk size, a 64-bit FNV-1a hash of the rest of
//    the plan (groups, permutation, axes, shapes, ...), the plan's signature
//    text and, when this host's verdict is not OK, a flag and its text
//    (truncated). When a host refused the op or the signatures differ, every
//    host fails the op alike with FAILED_PRECONDITION naming the hosts,
//    broken=false: nobody moved data and the connections stay usable; except
//    when the hosts' sequences or wire formats differ, which no later op
//    would mend: broken=true then. For a barrier the header exchange is the
//    whole op. Headers are received into 4 KiB (a header must never grow past
//    it) and their magic, version and size are checked before anything else
//    is read: a host of another build is named as such. The check is what
//    keeps the data phase in step: matching headers mean the same schedule on
//    every host, so every transfer's sender and receiver agree on its size
//    (the transport refuses a send longer than its receive as a protocol
//    error, which breaks the mesh).
//  - Late hosts: when a host's header has not come shortly before the op's
//    deadline (kQueryLead), the host is asked (HostTransport::Query) what its
//    members are doing at that op; the engine there answers with the members
//    it still waits for. At the deadline the op fails DEADLINE_EXCEEDED
//    naming them as the one-host daemon does ("missing: 5 (2,1) pid N host
//    h2 ..."), or naming the host when it never answered (a cut link, a hung
//    daemon).
//  - Data: RunSpanning (exec/spanning.h) with one partition per host
//    (a member's partition is its host's rank). Every host runs the same
//    deterministic schedule over the global member table and a HostFabric
//    does only this host's part of it: its local runs and copies, sends of
//    its bytes and receives into its memory; the rest is skipped. The
//    reductions whose members sit on the hosts in contiguous runs take the
//    chain schedule (each host combines its own members, one running result
//    crosses each link, pipelined in chunks, in the group's order), the
//    others the lanes or replication.
//  - Slots: every op's header goes on one slot (1 << 63), so that hosts at
//    different sequences still meet there (a mesh's ops run one at a time,
//    and a pair's messages of a slot match in order); op `s`'s data uses
//    (s << 24) | n for n = 1, 2, ... for every transfer of the schedule in
//    order (counted on every host, local or not), so two ops' data never
//    match each other.
//  - Placeholder regions: the members of other hosts (and their scratch)
//    have no memory here; they get addresses inside a PROT_NONE,
//    MAP_NORESERVE mapping of max(in_bytes, out_bytes, 1) bytes, so that the
//    schedule's pointer arithmetic stays valid and an accidental access
//    faults loudly instead of touching real memory.
//  - Failures: the transport breaks at its first failure and names it (a
//    peer's BREAK with its reason, a host gone, a protocol error); an op's
//    wait past its deadline is DEADLINE_EXCEEDED naming the hosts that did
//    not take part. Either way broken=true, and the mesh then fails later
//    ops at once (the engine breaks it). Abort(why) breaks the transport:
//    every other host is told `why` (its code and text) before the
//    connections shut down, and the op in flight fails with it. When
//    another host breaks the mesh (or is gone), the observer's on_broken
//    tells the engine at once, so idle meshes break too.
//  - Traffic: this host's share: the Traffic of its local executor runs,
//    plus the bytes it sent (read) and received (written), and its local
//    copies (read and written).
//
// Wire format: the header is a trivially copyable struct sent as bytes;
// every host of a mesh runs the same build on the same architecture.
#ifndef COLLECTIVED_DAEMON_CLUSTER_HOST_MESH_H_
#define COLLECTIVED_DAEMON_CLUSTER_HOST_MESH_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/cluster/host_transport.h"
#include "daemon/core/rendezvous.h"

namespace collectived {

struct HostMeshOptions {
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
  // The connections (frame size, handshake time). Their lanes (2) and
  // callbacks are the mesh's own.
  TransportOptions transport;
};

// Connects the mesh's hosts (HostTransport::Connect: rank topology.self of
// topology.hosts.size(), listening on `bind_host`, addresses published in
// `book` under `prefix`, every connection authenticated by `security`)
// before `deadline`, and returns the mesh's CrossHostMesh. Errors are the
// transport's (DEADLINE_EXCEEDED naming the hosts that did not connect,
// UNAVAILABLE, PERMISSION_DENIED), and INVALID_ARGUMENT for a bad topology.
absl::StatusOr<std::unique_ptr<CrossHostMesh>> ConnectHostMesh(
    AddressBook& book, const std::string& prefix, const MeshTopology& topology,
    const std::string& bind_host, TransportSecurity security, absl::Time deadline,
    const HostMeshOptions& options = {});

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_HOST_MESH_H_
