// libFuzzer target: what a client can write into its fast-path queue.
//
// Each input is published into a fresh session's real queue (FastPath, real
// Engine, a one-member mesh and a buffer), exactly where a client process
// writes: SQ entries with any `len`, any bytes, and then any counters.
//   u8 n (entries, mod 9);
//   n x { u8 flags; u8 claim_lo; u8 claim_hi; u8 size_lo; u8 size_hi; bytes }
//     flags bit 0: the bytes are an OpSpec; give it the real mesh and buffer
//     ids (a fuzzer cannot guess them) before it goes in the slot;
//     `claim` is the entry's len field (what the daemon is told), `size` the
//     bytes actually written;
//   optionally u8 which + u32 value: overwrite one header word with `value`
//     (sq_tail, sq_head, cq_tail, cq_head, closed) before ringing.
// The daemon must answer every published entry, or mark the queue closed,
// within a deadline, and never crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "collectived/v1/collective.pb.h"
#include "common/fast_queue.h"
#include "common/sync.h"
#include "daemon/core/engine.h"
#include "exec/cpu_executor.h"
#include "daemon/server/fast_path.h"
#include "daemon/util/log.h"

namespace collectived {
namespace {

struct Fixture {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<FastPath> fast_path;

  Fixture() {
    SetLogLevel(LogLevel::kError);
    google::protobuf::SetLogHandler(nullptr);  // parse errors are expected here
    EngineOptions options;
    options.max_buffer_size = 1 << 20;
    options.max_sessions = 1 << 16;
    engine = std::make_unique<Engine>(
        options, std::make_unique<CpuExecutor>(CpuExecutorOptions{.threads = 1, .chunk_bytes = 4096}));
    fast_path = std::make_unique<FastPath>(engine.get(), FastPathOptions{.spin = absl::ZeroDuration()});
  }
};

Fixture& GetFixture() {
  static Fixture* f = new Fixture();
  return *f;
}

struct Session {
  std::string id, mesh_id, buffer_id;
};

Session OpenSession(Engine& engine) {
  Session s;
  auto created = engine.CreateSession("fuzz");
  if (!created.ok()) std::abort();
  s.id = created->session_id;
  if (!engine.AttachSession(s.id, created->attach_token, 1, 0).ok()) std::abort();
  JoinRequest join;
  join.session_id = s.id;
  join.mesh_name = "fuzz-" + s.id.substr(2, 12);
  join.axes.push_back(AxisRequest{"i", 1});
  Notification joined;
  engine.JoinMesh(join, [&](absl::StatusOr<Joined> r) {
    if (!r.ok()) std::abort();
    s.mesh_id = r->mesh.mesh_id;
    joined.Notify();
  });
  if (!joined.WaitForNotificationWithTimeout(absl::Seconds(10))) std::abort();
  auto b = engine.AllocateBuffer(s.id, 64 * 1024);
  if (!b.ok()) std::abort();
  s.buffer_id = b->buffer_id;
  return s;
}

}  // namespace
}  // namespace collectived

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace collectived;
  if (size == 0) return 0;
  Fixture& f = GetFixture();
  Session s = OpenSession(*f.engine);
  if (!f.fast_path->Open(s.id).ok()) std::abort();
  fastq::QueueView q = fastq::QueueView::Of(f.fast_path->MappedQueue(s.id));
  const uint32_t n = data[0] % 9;
  size_t at = 1;
  uint32_t tail = 0;
  for (uint32_t i = 0; i < n && at + 5 <= size; ++i) {
    const uint8_t flags = data[at];
    const uint32_t claim = data[at + 1] | (uint32_t{data[at + 2]} << 8);
    size_t bytes = std::min<size_t>(data[at + 3] | (size_t{data[at + 4]} << 8), size - at - 5);
    std::string payload(reinterpret_cast<const char*>(data + at + 5), bytes);
    at += 5 + bytes;
    if (flags & 1) {
      v1::OpSpec op;
      if (op.ParseFromString(payload)) {
        op.set_mesh_id(s.mesh_id);
        op.mutable_input()->set_buffer_id(s.buffer_id);
        if (op.has_output()) op.mutable_output()->set_buffer_id(s.buffer_id);
        op.set_timeout_ms(0);
        payload = op.SerializeAsString();
      }
    }
    fastq::SqEntry& e = q.sq[tail % fastq::kSlots];
    e.tag = i;
    e.len = claim;
    e.submit_ns = fastq::MonotonicNs();
    std::memcpy(e.data, payload.data(), std::min(payload.size(), fastq::kMaxOpBytes));
    ++tail;
  }
  q.header->sq_tail.v.store(tail, std::memory_order_seq_cst);
  const bool overwrite = at + 5 <= size;
  if (overwrite) {
    uint32_t value;
    std::memcpy(&value, data + at + 1, sizeof(value));
    fastq::Word* words[] = {&q.header->sq_tail, &q.header->sq_head, &q.header->cq_tail,
                            &q.header->cq_head, &q.header->closed};
    words[data[at] % 5]->v.store(value, std::memory_order_seq_cst);
  }
  fastq::Ring(q.header->daemon_bell, q.header->daemon_sleeping);
  // Every entry is answered (ops on a one-member mesh complete), or the
  // daemon gave up on the queue; anything else within the deadline is a hang.
  // After an overwritten header word the counters prove nothing (the daemon
  // keeps its own), so such inputs only get time to do harm.
  const absl::Time deadline = absl::Now() + (overwrite ? absl::Milliseconds(20) : absl::Seconds(30));
  for (;;) {
    const bool closed = q.header->closed.v.load(std::memory_order_seq_cst) != 0;
    const uint32_t taken = q.header->sq_head.v.load(std::memory_order_seq_cst);
    const uint32_t done = q.header->cq_tail.v.load(std::memory_order_seq_cst);
    if (closed || (taken == tail && done == tail)) break;
    if (absl::Now() > deadline) {
      if (overwrite) break;
      std::abort();
    }
    absl::SleepFor(absl::Microseconds(100));
  }
  f.fast_path->Close(s.id);
  (void)f.engine->CloseSession(s.id, "fuzz input done");
  return 0;
}
