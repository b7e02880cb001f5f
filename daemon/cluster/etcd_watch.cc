// EtcdWatch (etcd_client.h): a watch's stream, resumed on another
// endpoint from the next revision when its stream fails.

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/cluster/etcd_client.h"
#include "daemon/cluster/etcd_connection.h"
#include "daemon/util/log.h"

namespace collectived {

using etcd_internal::Backoff;
using etcd_internal::Classify;
using etcd_internal::Connection;
using etcd_internal::Endpoint;
using etcd_internal::FromProto;
using etcd_internal::KeyWhat;
using etcd_internal::Verdict;

namespace {

// Waits for the one operation in flight on `cq`; its ok. When `deadline`
// passes first, cancels `ctx` (the operation then completes, failed) and
// sets *timed_out.
bool WaitOp(grpc::CompletionQueue* cq, grpc::ClientContext* ctx, absl::Time deadline,
            bool* timed_out) {
  void* tag = nullptr;
  bool ok = false;
  for (;;) {
    if (deadline == absl::InfiniteFuture()) return cq->Next(&tag, &ok) && ok;
    switch (cq->AsyncNext(&tag, &ok, absl::ToChronoTime(deadline))) {
      case grpc::CompletionQueue::GOT_EVENT:
        return ok;
      case grpc::CompletionQueue::SHUTDOWN:
        return false;
      case grpc::CompletionQueue::TIMEOUT:
        *timed_out = true;
        ctx->TryCancel();
        deadline = absl::InfiniteFuture();
        break;
    }
  }
}

}  // namespace

EtcdWatch::EtcdWatch(std::shared_ptr<Connection> conn, std::string key, std::string range_end,
                     int64_t start_revision, bool prev_kv)
    : conn_(std::move(conn)),
      key_(std::move(key)),
      range_end_(std::move(range_end)),
      prev_kv_(prev_kv),
      next_revision_(start_revision) {}

EtcdWatch::~EtcdWatch() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    if (context_ != nullptr) context_->TryCancel();
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

std::string EtcdWatch::Describe() const { return KeyWhat("watch", key_, !range_end_.empty()); }

absl::StatusOr<std::vector<EtcdEvent>> EtcdWatch::Next(absl::Time deadline) {
  MutexLock lock(&mu_);
  mu_.AwaitWithDeadline(
      [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !batches_.empty() || !end_.ok(); },
      deadline);
  if (!batches_.empty()) {
    std::vector<EtcdEvent> batch = std::move(batches_.front());
    batches_.pop_front();
    return batch;
  }
  if (!end_.ok()) return end_;
  return absl::DeadlineExceededError(absl::StrCat("etcd ",
                                                  conn_->endpoint(conn_->current()).address, ": ",
                                                  Describe(), ": no event before the deadline"));
}

int64_t EtcdWatch::next_revision() {
  MutexLock lock(&mu_);
  return next_revision_;
}

void EtcdWatch::End(absl::Status error) {
  MutexLock lock(&mu_);
  if (end_.ok()) end_ = std::move(error);
}

bool EtcdWatch::SleepUnlessStopped(absl::Duration d) {
  const absl::Time deadline = absl::Now() + d;
  MutexLock lock(&mu_);
  while (!stopping_ && absl::Now() < deadline) wake_.WaitWithDeadline(&mu_, deadline);
  return !stopping_;
}

void EtcdWatch::Run() {
  etcd_internal::Backoff backoff;
  absl::Time broken_since = absl::Now();
  bool reauthenticated = false;
  for (;;) {
    const size_t index = conn_->current();
    const std::string& address = conn_->endpoint(index).address;
    absl::Status st;
    std::string token;
    if (conn_->authenticates()) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + conn_->options().rpc_timeout));
      {
        MutexLock lock(&mu_);
        if (stopping_) return;
        context_ = &ctx;
      }
      absl::StatusOr<std::string> t = conn_->Token(index, &ctx);
      {
        MutexLock lock(&mu_);
        context_ = nullptr;
      }
      if (t.ok()) {
        token = *std::move(t);
      } else {
        st = t.status();
      }
    }
    bool created = false;
    if (st.ok()) st = RunStream(index, token, &created);
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (created) {
      backoff.Reset();
      reauthenticated = false;
      broken_since = absl::Now();
    }
    if (st.ok()) {
      st = absl::UnavailableError(
          absl::StrCat("etcd ", address, ": ", Describe(), ": etcd closed the watch stream"));
    }
    switch (etcd_internal::Classify(st)) {
      case etcd_internal::Verdict::kFail:
        End(st);
        return;
      case etcd_internal::Verdict::kReauthenticate:
        if (reauthenticated) {
          End(st);
          return;
        }
        reauthenticated = true;
        conn_->DropToken(token);
        continue;
      case etcd_internal::Verdict::kRetry:
        break;
    }
    int64_t next;
    {
      MutexLock lock(&mu_);
      last_error_ = st;
      next = next_revision_;
    }
    conn_->MoveOn(index, st);
    const absl::Duration broken = absl::Now() - broken_since;
    if (broken >= conn_->options().watch_resume_timeout) {
      End(absl::UnavailableError(
          absl::StrCat(st.message(), " [the watch could not resume on any etcd endpoint for ",
                       absl::FormatDuration(absl::Trunc(broken, absl::Milliseconds(1))),
                       next > 0 ? absl::StrCat("; watch again from revision ", next) : "", "]")));
      return;
    }
    if (!SleepUnlessStopped(backoff.Next())) return;
  }
}


absl::Status EtcdWatch::RunStream(size_t index, const std::string& token, bool* created) {
  Endpoint& e = conn_->endpoint(index);
  grpc::ClientContext ctx;
  Connection::Prepare(&ctx, token);
  etcdserverpb::WatchRequest req;
  {
    MutexLock lock(&mu_);
    if (stopping_) return absl::OkStatus();
    context_ = &ctx;
    etcdserverpb::WatchCreateRequest* create = req.mutable_create_request();
    create->set_key(key_);
    create->set_range_end(range_end_);
    create->set_start_revision(next_revision_);
    create->set_prev_kv(prev_kv_);
  }
  grpc::CompletionQueue cq;
  void* const tag = this;
  const absl::Time create_deadline = absl::Now() + conn_->options().rpc_timeout;
  bool timed_out = false;
  absl::Status result;
  auto stream = e.watch->PrepareAsyncWatch(&ctx, &cq);
  stream->StartCall(tag);
  bool ok = WaitOp(&cq, &ctx, create_deadline, &timed_out);
  if (ok) {
    stream->Write(req, tag);
    ok = WaitOp(&cq, &ctx, create_deadline, &timed_out);
  }
  etcdserverpb::WatchResponse resp;
  while (ok) {
    stream->Read(&resp, tag);
    if (!WaitOp(&cq, &ctx, *created ? absl::InfiniteFuture() : create_deadline, &timed_out)) {
      break;
    }
    result = OnResponse(index, resp, created);
    if (!result.ok()) {
      ctx.TryCancel();
      break;
    }
  }
  grpc::Status finish;
  stream->Finish(&finish, tag);
  bool unused = false;
  WaitOp(&cq, &ctx, absl::InfiniteFuture(), &unused);
  {
    MutexLock lock(&mu_);
    context_ = nullptr;
  }
  cq.Shutdown();
  void* ignored_tag;
  bool ignored_ok;
  while (cq.Next(&ignored_tag, &ignored_ok)) {
  }
  if (!result.ok()) return result;
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat("etcd ", e.address, ": ", Describe(), ": not created within ",
                     absl::FormatDuration(conn_->options().rpc_timeout)));
  }
  return conn_->Translate(finish, e.address, Describe());
}

absl::Status EtcdWatch::OnResponse(size_t index, const etcdserverpb::WatchResponse& resp,
                                   bool* created) {
  const std::string& address = conn_->endpoint(index).address;
  if (resp.canceled()) {
    int64_t next;
    {
      MutexLock lock(&mu_);
      next = next_revision_;
    }
    if (resp.compact_revision() > 0) {
      return absl::OutOfRangeError(
          absl::StrCat("etcd ", address, ": ", Describe(), " from revision ", next,
                       ": etcd has compacted the revisions before ", resp.compact_revision(),
                       "; read the keys again and watch from the revision of that read + 1"));
    }
    const std::string& reason = resp.cancel_reason();
    // The codes etcd gives these errors on unary calls (Classify reads them).
    absl::StatusCode code = absl::StatusCode::kAborted;
    if (absl::StrContains(reason, "invalid auth token") ||
        absl::StrContains(reason, "user name is empty")) {
      code = absl::StatusCode::kUnauthenticated;
    } else if (absl::StrContains(reason, "revision of auth store is old")) {
      code = absl::StatusCode::kInvalidArgument;
    } else if (absl::StrContains(reason, "permission denied")) {
      code = absl::StatusCode::kPermissionDenied;
    }
    return absl::Status(
        code, absl::StrCat("etcd ", address, ": ", Describe(), ": etcd cancelled the watch (",
                           reason.empty() ? "no reason given" : reason, ")",
                           next > 0 ? absl::StrCat("; watch again from revision ", next) : ""));
  }
  if (resp.created()) {
    *created = true;
    MutexLock lock(&mu_);
    created_ = true;
    last_error_ = absl::OkStatus();
    if (next_revision_ == 0) next_revision_ = resp.header().revision() + 1;
  }
  if (resp.events_size() == 0) return absl::OkStatus();
  std::vector<EtcdEvent> batch;
  batch.reserve(resp.events_size());
  for (const mvccpb::Event& ev : resp.events()) {
    EtcdEvent out;
    out.type =
        ev.type() == mvccpb::Event::DELETE ? EtcdEvent::Type::kDelete : EtcdEvent::Type::kPut;
    out.kv = FromProto(ev.kv());
    if (ev.has_prev_kv()) out.prev_kv = FromProto(ev.prev_kv());
    batch.push_back(std::move(out));
  }
  const int64_t next = batch.back().kv.mod_revision + 1;
  MutexLock lock(&mu_);
  next_revision_ = std::max(next_revision_, next);
  batches_.push_back(std::move(batch));
  return absl::OkStatus();
}

}  // namespace collectived
