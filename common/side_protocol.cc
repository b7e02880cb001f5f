#include "common/side_protocol.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace collectived::side {

std::string ErrorReply(const absl::Status& status) {
  return absl::StrCat(kErr, " ", static_cast<int>(status.code()), " ", status.message());
}

absl::Status ReplyStatus(absl::string_view reply) {
  if (reply.substr(0, kOk.size()) == kOk) return absl::OkStatus();
  std::vector<absl::string_view> parts = absl::StrSplit(reply, absl::MaxSplits(' ', 2));
  int code = 0;
  if (parts.size() == 3 && parts[0] == kErr && absl::SimpleAtoi(parts[1], &code) && code > 0 &&
      code <= 16) {
    return absl::Status(static_cast<absl::StatusCode>(code), parts[2]);
  }
  return absl::InternalError(absl::StrCat("unexpected side-socket reply: ", reply));
}

}  // namespace collectived::side
