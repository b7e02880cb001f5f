// libFuzzer target: request validation and the op decoder.
//
// Each input is a serialized OpSpec (the bytes of an Execute/Submit op as they
// arrive off the wire). It is planned against meshes of several shapes
// (PlanOp), then submitted to a live engine with a formed one-member mesh and
// a real buffer — as sent, and again with the mesh and buffer ids replaced by
// the real ones, so that inputs reach the buffer-range checks and the executor.
// Every rejection must be a status, never a crash, an out-of-bounds access
// (ASan) or a hang; every accepted op must complete.
//
// Built two ways: with clang -fsanitize=fuzzer (scripts/fuzz.sh runs it), and
// as a plain program that replays the corpus (a ctest), via fuzz_main.cc.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include <google/protobuf/stubs/logging.h>

#include "collectived/v1/collective.pb.h"
#include "common/sync.h"
#include "daemon/core/engine.h"
#include "plan/wire_plan.h"
#include "exec/cpu_executor.h"
#include "daemon/util/log.h"

namespace collectived {
namespace {

struct Fixture {
  std::unique_ptr<Engine> engine;
  std::string session, mesh_id, buffer_id;
  size_t buffer_size = 0;

  Fixture() {
    SetLogLevel(LogLevel::kError);
    google::protobuf::SetLogHandler(nullptr);  // parse errors are expected here
    EngineOptions options;
    options.max_buffer_size = 1 << 20;
    engine = std::make_unique<Engine>(
        options, std::make_unique<CpuExecutor>(CpuExecutorOptions{.threads = 1, .chunk_bytes = 4096}));
    auto s = engine->CreateSession("fuzz");
    session = s->session_id;
    (void)engine->AttachSession(session, s->attach_token, 1, 0);
    JoinRequest join;
    join.session_id = session;
    join.mesh_name = "fuzz";
    join.axes.push_back(AxisRequest{"i", 1});
    Notification joined;
    engine->JoinMesh(join, [&](absl::StatusOr<Joined> r) {
      if (!r.ok()) std::abort();
      mesh_id = r->mesh.mesh_id;
      joined.Notify();
    });
    if (!joined.WaitForNotificationWithTimeout(absl::Seconds(10))) std::abort();
    auto b = engine->AllocateBuffer(session, 64 * 1024);
    if (!b.ok()) std::abort();
    buffer_id = b->buffer_id;
    buffer_size = static_cast<size_t>(b->size_bytes);
  }
};

Fixture& GetFixture() {
  static Fixture* f = new Fixture();
  return *f;
}

}  // namespace
}  // namespace collectived

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace collectived;
  v1::OpSpec op;
  if (!op.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (const MeshShape& shape :
       {MeshShape{{"i"}, {1}}, MeshShape{{"i"}, {3}}, MeshShape{{"x", "y"}, {2, 4}}}) {
    auto plan = PlanOp(op, shape);
    if (plan.ok() && plan->out_shape.size() > kMaxRank + 1) std::abort();
  }
  Fixture& f = GetFixture();
  // As sent, then with the real mesh and buffer ids (which a fuzzer cannot
  // guess), so inputs reach the range checks and the executor.
  for (bool real_ids : {false, true}) {
    if (real_ids) {
      op.set_mesh_id(f.mesh_id);
      op.mutable_input()->set_buffer_id(f.buffer_id);
      if (op.has_output()) op.mutable_output()->set_buffer_id(f.buffer_id);
    }
    op.set_timeout_ms(0);
    auto done = std::make_shared<Notification>();
    auto accepted = f.engine->Submit(f.session, FromProto(op), /*retain=*/false,
                                     [done](const OpOutcome&) { done->Notify(); });
    if (accepted.ok() && !done->WaitForNotificationWithTimeout(absl::Seconds(30))) {
      std::abort();  // an accepted op on a one-member mesh must complete
    }
  }
  return 0;
}
