// An AddressBook (daemon/cluster/host_transport.h) in memory, for the hosts
// of a mesh that are threads of one process (tests, the fuzzer): a map,
// and waits on a condition variable. Thread-safe.
#ifndef COLLECTIVED_TESTS_HARNESS_MEMORY_BOOK_H_
#define COLLECTIVED_TESTS_HARNESS_MEMORY_BOOK_H_

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "daemon/cluster/host_transport.h"

namespace collectived::testing {

class MemoryBook final : public AddressBook {
 public:
  absl::Status Publish(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!values_.emplace(key, value).second) return absl::AlreadyExistsError(key);
    cv_.notify_all();
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<std::string>> Lookup(const std::vector<std::string>& keys,
                                                  absl::Time deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      std::vector<std::string> out;
      for (const std::string& k : keys) {
        auto it = values_.find(k);
        if (it == values_.end()) break;
        out.push_back(it->second);
      }
      if (out.size() == keys.size()) return out;
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("keys missing: ", absl::StrJoin(keys, ",")));
      }
      cv_.wait_for(lock, std::chrono::milliseconds(5));
    }
  }
  // The value of `key`, waiting for it at most 30 s ("" if it never came).
  std::string Wait(const std::string& key) {
    auto v = Lookup({key}, absl::Now() + absl::Seconds(30));
    return v.ok() ? (*v)[0] : "";
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

}  // namespace collectived::testing

#endif  // COLLECTIVED_TESTS_HARNESS_MEMORY_BOOK_H_
