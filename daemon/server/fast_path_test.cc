// FastPath in one process: the engine, the queue threads and "clients" that
// are threads speaking the queue protocol on the real memfd queues. Runs
// under TSan (the cross-process tests in tests/fastpath cover the SDK).
#include "daemon/server/fast_path.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/fast_queue.h"
#include "common/sync.h"
#include "daemon/server/wire.h"
#include "exec/cpu_executor.h"

namespace collectived {
namespace {

constexpr absl::Duration kWait = absl::Seconds(20);

// One member: a session with a buffer and its mapped queue.
struct Member {
  std::string session;
  std::string buffer_id;
  int32_t* data = nullptr;
  fastq::QueueView q;
  uint32_t tail = 0, head = 0;
  uint64_t tag = 0;

  void Publish(const v1::OpSpec& op) {
    fastq::SqEntry& e = q.sq[tail % fastq::kSlots];
    e.tag = ++tag;
    e.len = static_cast<uint32_t>(op.ByteSizeLong());
    ASSERT_TRUE(op.SerializeToArray(e.data, static_cast<int>(fastq::kMaxOpBytes)));
    e.submit_ns = fastq::MonotonicNs();
    q.header->sq_tail.v.store(++tail, std::memory_order_seq_cst);
    fastq::Ring(q.header->daemon_bell, q.header->daemon_sleeping);
  }

  // The next completion (code, message), or nullopt at the deadline.
  std::optional<std::pair<int, std::string>> Reap(absl::Duration spin) {
    const bool ready = fastq::SpinThenSleep(
        q.header->client_bell, q.header->client_sleeping,
        [this] { return q.header->cq_tail.v.load(std::memory_order_seq_cst) != head; },
        [] { return true; }, spin, absl::Milliseconds(100), absl::Now() + kWait);
    if (!ready) return std::nullopt;
    const fastq::CqEntry& c = q.cq[head % fastq::kSlots];
    EXPECT_EQ(c.tag, tag);
    std::pair<int, std::string> r{c.code, std::string(c.msg, std::min<size_t>(c.msg_len, sizeof(c.msg)))};
    q.header->cq_head.v.store(++head, std::memory_order_seq_cst);
    fastq::Ring(q.header->daemon_bell, q.header->daemon_sleeping);
    return r;
  }
};

class FastPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = std::make_unique<Engine>(
        EngineOptions{}, std::make_unique<CpuExecutor>(CpuExecutorOptions{.threads = 2}));
    fast_ = std::make_unique<FastPath>(engine_.get(), FastPathOptions{});
  }
  void TearDown() override {
    fast_->Stop();
    engine_->Shutdown("test over");
  }

  // Opens `n` members on one mesh "m" of one axis "i".
  std::vector<std::unique_ptr<Member>> Open(int n, int64_t elements) {
    std::vector<std::unique_ptr<Member>> members;
    std::vector<std::unique_ptr<Notification>> joined;
    for (int i = 0; i < n; ++i) {
      auto m = std::make_unique<Member>();
      auto s = engine_->CreateSession(absl::StrCat("member", i));
      EXPECT_TRUE(s.ok());
      m->session = s->session_id;
      EXPECT_TRUE(engine_->AttachSession(m->session, s->attach_token, 1000 + i, 0).ok());
      auto b = engine_->AllocateBuffer(m->session, elements * 4);
      EXPECT_TRUE(b.ok());
      m->buffer_id = b->buffer_id;
      m->data = static_cast<int32_t*>((*engine_->GetBuffer(m->session, m->buffer_id))->data());
      auto fd = fast_->Open(m->session);
      EXPECT_TRUE(fd.ok()) << fd.status();
      // The daemon's mapping, not one of our own (see MappedQueue).
      void* queue = fast_->MappedQueue(m->session);
      EXPECT_NE(queue, nullptr);
      m->q = fastq::QueueView::Of(queue);
      EXPECT_TRUE(fastq::HeaderValid(m->q.header));
      JoinRequest req;
      req.session_id = m->session;
      req.mesh_name = "m";
      req.axes.push_back(AxisRequest{"i", n});
      req.timeout_ms = 10000;
      auto done = std::make_unique<Notification>();
      engine_->JoinMesh(req, [d = done.get(), this](absl::StatusOr<Joined> r) {
        EXPECT_TRUE(r.ok()) << r.status();
        if (r.ok()) {
          MutexLock lock(&mu_);
          mesh_id_ = r->mesh.mesh_id;
        }
        d->Notify();
      });
      joined.push_back(std::move(done));
      members.push_back(std::move(m));
    }
    for (auto& d : joined) EXPECT_TRUE(d->WaitForNotificationWithTimeout(kWait));
    return members;
  }

  v1::OpSpec Psum(const Member& m, int64_t elements) {
    v1::OpSpec op;
    {
      MutexLock lock(&mu_);
      op.set_mesh_id(mesh_id_);
    }
    op.set_kind(v1::PSUM);
    op.add_axes("i");
    op.set_dtype(v1::INT32);
    op.add_shape(elements);
    op.mutable_input()->set_buffer_id(m.buffer_id);
    return op;
  }

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<FastPath> fast_;
  Mutex mu_;
  std::string mesh_id_ ABSL_GUARDED_BY(mu_);
};

// Members on threads run many psums through their queues, polling and
// sleeping; every result is exact and arrives in order.
TEST_F(FastPathTest, ManyOpsThroughTheQueuesAreExact) {
  const int n = 3;
  const int64_t elements = 64;
  auto members = Open(n, elements);
  for (absl::Duration spin : {absl::ZeroDuration(), absl::Microseconds(200)}) {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i, spin] {
        Member& m = *members[i];
        const v1::OpSpec op = Psum(m, elements);
        for (int iter = 0; iter < 300; ++iter) {
          for (int64_t e = 0; e < elements; ++e) m.data[e] = i * 1000 + iter + static_cast<int32_t>(e);
          m.Publish(op);
          auto r = m.Reap(spin);
          ASSERT_TRUE(r.has_value()) << "member " << i << " op " << iter << " never completed";
          ASSERT_EQ(r->first, 0) << r->second;
          for (int64_t e = 0; e < elements; ++e) {
            // sum over members of (k * 1000 + iter + e)
            ASSERT_EQ(m.data[e], 1000 * (n * (n - 1) / 2) + n * (iter + static_cast<int32_t>(e)));
          }
        }
      });
    }
    for (auto& t : threads) t.join();
  }
}

// The queue threads poll only while a CPU is free for them: at most the
// CPUs less the members that poll member-side, less those polling already.
TEST(SpinBudgetTest, LeavesTheCpusOfPollingMembersAlone) {
  int members = 0;
  SpinBudget budget(2, [&members] { return members; });
  EXPECT_EQ(budget.cpus(), 2);
  EXPECT_TRUE(budget.TryStartSpin());
  EXPECT_TRUE(budget.TryStartSpin());
  EXPECT_FALSE(budget.TryStartSpin()) << "a third poller on 2 CPUs";
  budget.EndSpin();
  members = 1;
  EXPECT_FALSE(budget.TryStartSpin()) << "one member polls and one thread does: no CPU free";
  budget.EndSpin();
  EXPECT_TRUE(budget.TryStartSpin());
  EXPECT_FALSE(budget.TryStartSpin());
  budget.EndSpin();
  members = 2;
  EXPECT_FALSE(budget.TryStartSpin()) << "two polling members on 2 CPUs";
  members = 0;
  EXPECT_TRUE(budget.TryStartSpin()) << "the members' sessions closed";
  budget.EndSpin();
}

// With no CPU to spare, the queue threads sleep at once: every op is still
// served, through the futex.
TEST_F(FastPathTest, QueuesWithoutAFreeCpuAreServedAsleep) {
  fast_->Stop();
  fast_ = std::make_unique<FastPath>(engine_.get(), FastPathOptions{}, /*cpus=*/1);
  ASSERT_TRUE(fast_->spin_budget().TryStartSpin()) << "nothing polls yet";
  // This test polls the only CPU the budget has from now on.
  const int n = 2;
  const int64_t elements = 16;
  auto members = Open(n, elements);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      Member& m = *members[i];
      const v1::OpSpec op = Psum(m, elements);
      for (int iter = 0; iter < 50; ++iter) {
        for (int64_t e = 0; e < elements; ++e) m.data[e] = i + iter;
        m.Publish(op);
        auto r = m.Reap(absl::ZeroDuration());
        ASSERT_TRUE(r.has_value()) << "member " << i << " op " << iter << " never completed";
        ASSERT_EQ(r->first, 0) << r->second;
        ASSERT_EQ(m.data[0], 1 + 2 * iter);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(fast_->spin_budget().TryStartSpin());
  fast_->spin_budget().EndSpin();
}

// A bad entry fails only that op; impossible counters close the session,
// and the other session's queue keeps working.
TEST_F(FastPathTest, UntrustedEntriesAndCountersAreContained) {
  auto members = Open(1, 16);
  Member& m = *members[0];

  // An entry claiming more bytes than a slot holds.
  fastq::SqEntry& e = m.q.sq[m.tail % fastq::kSlots];
  e.tag = ++m.tag;
  e.len = fastq::kSqSlotBytes * 4;
  m.q.header->sq_tail.v.store(++m.tail, std::memory_order_seq_cst);
  fastq::Ring(m.q.header->daemon_bell, m.q.header->daemon_sleeping);
  auto r = m.Reap(absl::ZeroDuration());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first, static_cast<int>(absl::StatusCode::kInvalidArgument)) << r->second;

  // Bytes that are no OpSpec.
  fastq::SqEntry& g = m.q.sq[m.tail % fastq::kSlots];
  g.tag = ++m.tag;
  g.len = 8;
  std::memset(g.data, 0xFF, 8);
  m.q.header->sq_tail.v.store(++m.tail, std::memory_order_seq_cst);
  fastq::Ring(m.q.header->daemon_bell, m.q.header->daemon_sleeping);
  r = m.Reap(absl::ZeroDuration());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first, static_cast<int>(absl::StatusCode::kInvalidArgument)) << r->second;

  // The session still works.
  m.Publish(Psum(m, 16));
  r = m.Reap(absl::ZeroDuration());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first, 0) << r->second;

  // An impossible tail: the daemon closes the session.
  m.q.header->sq_tail.v.store(m.tail + 1000, std::memory_order_seq_cst);
  fastq::Ring(m.q.header->daemon_bell, m.q.header->daemon_sleeping);
  const absl::Time deadline = absl::Now() + kWait;
  bool gone = false;
  while (!gone && absl::Now() < deadline) {
    gone = true;
    // Sessions are listed by their DisplayId only.
    for (const SessionView& s : engine_->ListSessions()) {
      gone = gone && s.session_id != DisplayId(m.session);
    }
    if (!gone) absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(gone) << "the session with corrupt counters is still open";
  // A second queue for a session that has one is refused; an unknown
  // session's queue opens (it is served, every op fails NOT_FOUND).
  auto again = fast_->Open(m.session);
  EXPECT_FALSE(again.ok());
}

}  // namespace
}  // namespace collectived
