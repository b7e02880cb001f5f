#include "common/device.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace collectived {
namespace {

constexpr absl::string_view kAcceptedForms =
    "\"\" or \"cpu\" (host memory), \"cuda:N\" (N a GPU ordinal: decimal digits), "
    "\"cuda:GPU-<uuid>\" or \"GPU-<uuid>\" (a GPU by UUID, as nvidia-smi -L prints it)";

absl::Status BadDevice(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("device '", absl::CHexEscape(text), "' ", why,
                                                 "; accepted: ", kAcceptedForms));
}

// "GPU-" followed by hexadecimal digits and dashes (a UUID as CUDA prints
// it; "GPU-" alone is not one). At most 64 characters.
bool ValidUuid(absl::string_view uuid) {
  if (!absl::StartsWith(uuid, "GPU-") || uuid.size() <= 4 || uuid.size() > 64) return false;
  for (char c : uuid.substr(4)) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != '-') return false;
  }
  return true;
}

}  // namespace

std::string DeviceSpec::ToString() const {
  if (kind == Kind::kCpu) return "cpu";
  if (!uuid.empty()) return absl::StrCat("cuda:", uuid);
  return absl::StrCat("cuda:", ordinal);
}

absl::StatusOr<DeviceSpec> ParseDevice(absl::string_view text) {
  DeviceSpec spec;
  if (text.empty() || text == "cpu") return spec;
  if (text.size() > 128) return BadDevice(text.substr(0, 32), "is longer than 128 characters");
  absl::string_view rest = text;
  if (absl::ConsumePrefix(&rest, "cuda:")) {
    spec.kind = DeviceSpec::Kind::kCuda;
    if (absl::StartsWith(rest, "GPU-")) {
      if (!ValidUuid(rest)) return BadDevice(text, "has a malformed GPU UUID");
      spec.uuid = std::string(rest);
      return spec;
    }
    // A non-negative decimal ordinal: digits only (no sign, no spaces), at
    // most 9 of them so it fits an int.
    if (rest.empty() || rest.size() > 9) return BadDevice(text, "has no valid GPU ordinal");
    int ordinal = 0;
    for (char c : rest) {
      if (c < '0' || c > '9') return BadDevice(text, "has no valid GPU ordinal");
      ordinal = ordinal * 10 + (c - '0');
    }
    spec.ordinal = ordinal;
    return spec;
  }
  if (absl::StartsWith(text, "GPU-")) {
    if (!ValidUuid(text)) return BadDevice(text, "has a malformed GPU UUID");
    spec.kind = DeviceSpec::Kind::kCuda;
    spec.uuid = std::string(text);
    return spec;
  }
  return BadDevice(text, "is not a device name");
}

}  // namespace collectived
