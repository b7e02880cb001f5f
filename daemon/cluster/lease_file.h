// The lease a daemon holds in its cluster, kept in a file beside its socket
// (ClusterClientOptions::lease_file), so that a restarted daemon can show
// the coordinator its former lease and take its host id back at once; any
// other daemon claiming a live host id is refused (Coordinator::Join).
//
// The file holds the lease id alone, mode 0600 (a lease id lets its holder
// speak for the host). Written atomically (a temporary file renamed over
// it). Thread-compatible: one writer per file.
#ifndef COLLECTIVED_DAEMON_CLUSTER_LEASE_FILE_H_
#define COLLECTIVED_DAEMON_CLUSTER_LEASE_FILE_H_

#include <string>

#include "absl/status/status.h"

namespace collectived {

// The lease id in `path`, or "" when there is none (no path, no file, or
// one that is not a lease id).
std::string ReadLeaseFile(const std::string& path);
// Replaces `path`'s content with `lease_id` ("" removes the file). Errors
// are the file system's (the daemon logs them and goes on: without the
// file a restart waits for the old lease to end).
absl::Status WriteLeaseFile(const std::string& path, const std::string& lease_id);

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_LEASE_FILE_H_
