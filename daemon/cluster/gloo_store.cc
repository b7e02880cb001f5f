#include "daemon/cluster/gloo_store.h"

#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"

namespace collectived {
namespace {

absl::Duration ToDuration(std::chrono::milliseconds ms) {
  return absl::Milliseconds(ms.count());
}

[[noreturn]] void Throw(const char* what, const absl::Status& status) {
  throw gloo::IoException(absl::StrCat("cluster store ", what, ": ", status.ToString()));
}

}  // namespace

void ClusterGlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status st =
      client_->Set(key, std::string(data.begin(), data.end()), /*overwrite=*/false);
  if (!st.ok()) Throw("set", st);
}

std::vector<char> ClusterGlooStore::get(const std::string& key) {
  auto values = client_->Get({key}, ToDuration(timeout_));
  if (!values.ok()) Throw("get", values.status());
  const std::string& v = values->front();
  return std::vector<char>(v.begin(), v.end());
}

void ClusterGlooStore::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  if (keys.empty()) return;
  // Gloo's kNoTimeout (zero) means no wait limit: the coordinator's cap
  // (kMaxKeyWait) bounds it.
  const absl::Duration d = timeout.count() <= 0 ? kMaxKeyWait : ToDuration(timeout);
  auto values = client_->Get(keys, d);
  if (!values.ok()) Throw("wait", values.status());
}

}  // namespace collectived
