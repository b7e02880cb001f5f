// OpState's waits and OpFuture, over the op's OpWaiter.
#include "client/src/op_state.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace collectived {

bool OpState::Poll() {
  if (Ready()) return true;
  return queue_ != nullptr && queue_->Wait(this, absl::InfinitePast());
}

absl::Status OpState::Wait(std::optional<absl::Duration> timeout) {
  const absl::Duration t = timeout.value_or(default_wait_);
  bool done;
  if (queue_) {
    done = queue_->Wait(this, absl::Now() + t);
  } else {
    MutexLock lock(&mu_);
    done = mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return done_; }, t);
  }
  if (!done) {
    return absl::DeadlineExceededError(absl::StrCat(
        "no answer from the daemon for this op within ", absl::FormatDuration(t)));
  }
  return status();
}

absl::Status OpFuture::Wait(std::optional<absl::Duration> timeout) const {
  if (!state_) return absl::FailedPreconditionError("empty OpFuture");
  return state_->Wait(timeout);
}
bool OpFuture::Ready() const { return state_ && state_->Poll(); }
absl::Duration OpFuture::default_timeout() const {
  return state_ ? state_->default_wait() : absl::ZeroDuration();
}
int64_t OpFuture::sequence() const { return state_ ? state_->sequence() : -1; }
std::vector<int64_t> OpFuture::out_shape() const {
  return state_ ? state_->out_shape() : std::vector<int64_t>{};
}
DType OpFuture::out_dtype() const { return state_ ? state_->out_dtype() : DType::kInvalid; }
OpTiming OpFuture::timing() const { return state_ ? state_->timing() : OpTiming{}; }
OpTraffic OpFuture::traffic() const { return state_ ? state_->traffic() : OpTraffic{}; }

}  // namespace collectived
