// ClusterGlooStore: gloo::rendezvous::Store over the coordinator's key-value
// store, so that Gloo contexts of several hosts rendezvous through the
// cluster (gloo::rendezvous::Context::connectFullMesh).
//
// set() refuses to replace a key (a second rank claiming the same slot is an
// error, not a silent overwrite): give each context generation its own
// prefix (gloo::rendezvous::PrefixStore). get() waits up to the store's
// timeout for the key, as Gloo's own stores do; wait(keys, timeout) waits at
// most `timeout`. Failures throw gloo::IoException with the coordinator's
// message (a timeout names the missing keys), which is how Gloo reports store
// errors.
//
// Thread-safety: as ClusterClient (a mesh connects its two Gloo contexts
// through one store from two threads).
#ifndef COLLECTIVED_DAEMON_CLUSTER_GLOO_STORE_H_
#define COLLECTIVED_DAEMON_CLUSTER_GLOO_STORE_H_

#include <chrono>
#include <string>
#include <vector>

#include "daemon/cluster/cluster_client.h"
#include "gloo/rendezvous/store.h"

namespace collectived {

class ClusterGlooStore final : public gloo::rendezvous::Store {
 public:
  // `client` must outlive the store. `timeout` bounds get() and the
  // timeout-less wait() (Gloo's default is 30 s).
  explicit ClusterGlooStore(ClusterClient* client,
                            std::chrono::milliseconds timeout = kDefaultTimeout)
      : client_(client), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  ClusterClient* const client_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_GLOO_STORE_H_
