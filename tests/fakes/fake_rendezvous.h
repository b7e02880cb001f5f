// A stand-in for the cluster (daemon/core/rendezvous.h) in tests: the
// registry's and the other hosts' side are the test's. Every Register, Form
// and Leave the engine makes is queued for the test to take (Next*) and to
// answer when and how it chooses, from its own thread, which the engine sees
// as a thread of the rendezvous (never holding the engine's lock). A formed
// mesh's connections are a FakeCrossHostMesh whose ops the test takes and
// completes the same way, and whose observer (the other hosts' breaks and
// questions) the test calls. So the engine's forming and running across
// hosts is tested in one process, without daemons, sockets or a registry.
#ifndef COLLECTIVED_TESTS_FAKES_FAKE_RENDEZVOUS_H_
#define COLLECTIVED_TESTS_FAKES_FAKE_RENDEZVOUS_H_

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/sync.h"
#include "daemon/core/rendezvous.h"

namespace collectived {

// Calls queued by one thread and taken, with a deadline, by another.
template <typename T>
class CallQueue {
 public:
  void Push(T item) {
    MutexLock lock(&mu_);
    items_.push_back(std::move(item));
    cv_.SignalAll();
  }
  // The oldest call, waiting up to `timeout` for one; nullopt if none came.
  std::optional<T> Take(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    MutexLock lock(&mu_);
    while (items_.empty()) {
      if (!cv_.WaitWithDeadline(&mu_, deadline) && items_.empty()) return std::nullopt;
    }
    T item = std::move(items_.front());
    items_.pop_front();
    return item;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::deque<T> items_ ABSL_GUARDED_BY(mu_);
};

// One mesh's connections to the other hosts, as the test plays them.
class FakeCrossHostMesh final : public CrossHostMesh {
 public:
  struct Started {
    std::shared_ptr<const OpPlan> plan;
    int64_t sequence = 0;
    std::vector<MemberIo> io;
    absl::Status verdict;
    absl::Time deadline;
    Done done;
  };
  // What the test keeps of the connections once the engine owns them.
  struct State {
    CallQueue<Started> starts;
    Mutex mu;
    std::vector<absl::Status> aborts ABSL_GUARDED_BY(mu);
    std::optional<CrossHostObserver> observer ABSL_GUARDED_BY(mu);
    std::atomic<bool> destroyed{false};

    std::vector<absl::Status> Aborts() {
      MutexLock lock(&mu);
      return aborts;
    }
    // The engine's observer, once installed (it installs it outside its
    // lock, right after the mesh formed): waits up to `timeout`.
    std::optional<CrossHostObserver> Observer(absl::Duration timeout) {
      const absl::Time deadline = absl::Now() + timeout;
      for (;;) {
        {
          MutexLock lock(&mu);
          if (observer.has_value()) return observer;
        }
        if (absl::Now() >= deadline) return std::nullopt;
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
  };

  FakeCrossHostMesh() : state_(std::make_shared<State>()) {}
  // Ops the test never took fail as an aborted mesh's would.
  ~FakeCrossHostMesh() override {
    Abort(absl::AbortedError("the fake mesh was destroyed"));
    state_->destroyed = true;
  }

  std::shared_ptr<State> state() const { return state_; }

  void Start(std::shared_ptr<const OpPlan> plan, int64_t sequence, std::vector<MemberIo> io,
             Executor*, absl::Status verdict, absl::Time deadline, Done done,
             absl::Duration) override {
    absl::Status aborted;
    {
      MutexLock lock(&state_->mu);
      if (!state_->aborts.empty()) aborted = state_->aborts.front();
    }
    // An aborted mesh fails later ops at once (CrossHostMesh::Abort).
    if (!aborted.ok()) {
      done(aborted, true, Traffic{});
      return;
    }
    state_->starts.Push(Started{std::move(plan), sequence, std::move(io), std::move(verdict),
                                deadline, std::move(done)});
  }
  void Abort(const absl::Status& why) override {
    {
      MutexLock lock(&state_->mu);
      state_->aborts.push_back(why);
    }
    while (auto s = state_->starts.Take(absl::ZeroDuration())) s->done(why, true, Traffic{});
  }
  void Observe(CrossHostObserver observer) override {
    MutexLock lock(&state_->mu);
    state_->observer = std::move(observer);
  }

 private:
  const std::shared_ptr<State> state_;
};

class FakeRendezvous final : public MeshRendezvous {
 public:
  struct Registration {
    MeshJoinInfo info;
    int index = 0;
    absl::Time deadline;
    absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done;
  };
  struct Formation {
    std::string key;
    int64_t generation = 0;
    absl::Time deadline;
    std::shared_ptr<const std::atomic<bool>> cancel;
    absl::AnyInvocable<void(absl::StatusOr<FormedMesh>)> done;
  };
  struct Departure {
    std::string key;
    int64_t generation = 0;
    std::vector<int> indices;
    bool broken = false;
    std::string reason;
  };

  explicit FakeRendezvous(std::string host_id) : host_id_(std::move(host_id)) {}

  RendezvousStatus Status() override { return RendezvousStatus{"joined", "fake", false, ""}; }
  std::string host_id() const override { return host_id_; }

  void Register(const MeshJoinInfo& info, int index, absl::Time deadline,
                absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done) override {
    registrations.Push(Registration{info, index, deadline, std::move(done)});
  }
  void Form(const std::string& key, int64_t generation, absl::Time deadline,
            std::shared_ptr<const std::atomic<bool>> cancel,
            absl::AnyInvocable<void(absl::StatusOr<FormedMesh>)> done) override {
    formations.Push(Formation{key, generation, deadline, std::move(cancel), std::move(done)});
  }
  void Leave(const std::string& key, int64_t generation, std::vector<int> indices, bool broken,
             const std::string& reason) override {
    departures.Push(Departure{key, generation, std::move(indices), broken, reason});
  }

  CallQueue<Registration> registrations;
  CallQueue<Formation> formations;
  CallQueue<Departure> departures;

 private:
  const std::string host_id_;
};

}  // namespace collectived

#endif  // COLLECTIVED_TESTS_FAKES_FAKE_RENDEZVOUS_H_
