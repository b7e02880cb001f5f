// The words the daemon and the SDK exchange outside the protobuf messages,
// spelled once for both: the side socket's requests and replies
// (daemon/server/side_channel.h) and the gRPC metadata key of the Execute
// stream.
//
// Side socket: one request per packet, words separated by spaces; one reply
// per request, "OK ..." (with a descriptor where said) or
// "ERR <absl status code number> <message>".
//
// Thread-safety: constants and pure functions.
#ifndef COLLECTIVED_COMMON_SIDE_PROTOCOL_H_
#define COLLECTIVED_COMMON_SIDE_PROTOCOL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace collectived::side {

// "ATTACH <session id> <attach token>" -> "OK": binds the connection to the
// session (its peer credentials become the session's pid and uid).
inline constexpr absl::string_view kAttach = "ATTACH";
// "FD <buffer id>" -> "OK <size>" with the buffer's descriptor.
inline constexpr absl::string_view kFd = "FD";
// "QUEUE" -> "OK <bytes> <version>" with the fast-path queue's descriptor.
inline constexpr absl::string_view kQueue = "QUEUE";
// "SEGMENT <mesh id>" -> "OK <bytes>" with the mesh's member-side segment
// (common/member_ops.h), for members of that mesh generation only.
inline constexpr absl::string_view kSegment = "SEGMENT";
// "PEERFD <mesh id> <member> <buffer id>" -> "OK <size>" with a read-only
// descriptor of a buffer of another member of that mesh generation, run by
// the same user (Engine::GetPeerBuffer; member-side all_gathers that read
// the members' inputs).
inline constexpr absl::string_view kPeerFd = "PEERFD";
// "EXPIRED <mesh id> <d> <s>" -> "OK 1" when the mesh broke because a member
// is missing at member-side place (d, s) (the segment says why), "OK 0" when
// nobody is missing.
inline constexpr absl::string_view kExpired = "EXPIRED";
inline constexpr absl::string_view kOk = "OK";
inline constexpr absl::string_view kErr = "ERR";

// "ERR <code> <message>" for `status` (not OK).
std::string ErrorReply(const absl::Status& status);
// OK for a reply starting with "OK"; the status an "ERR" reply carries;
// INTERNAL naming the reply for anything else.
absl::Status ReplyStatus(absl::string_view reply);

}  // namespace collectived::side

namespace collectived {

// gRPC metadata key carrying the session id on the Execute stream.
inline constexpr char kSessionMetadataKey[] = "collectived-session";

}  // namespace collectived

#endif  // COLLECTIVED_COMMON_SIDE_PROTOCOL_H_
