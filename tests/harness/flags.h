// Flags of the test worker processes: "--name=value" arguments.
#ifndef COLLECTIVED_TESTS_HARNESS_FLAGS_H_
#define COLLECTIVED_TESTS_HARNESS_FLAGS_H_

#include <cstdlib>
#include <string>

namespace collectived::testing {

// When `arg` is "--<name>=<value>": *out = value, true. Otherwise false and
// *out untouched.
inline bool FlagValue(const std::string& arg, const char* name, std::string* out) {
  const std::string prefix = std::string("--") + name + "=";
  if (arg.rfind(prefix, 0) != 0) return false;
  *out = arg.substr(prefix.size());
  return true;
}

// The flags every member worker takes (WorkerArgv in harness.h passes the
// first four): --socket, --mesh, --members, --member, and --mode. A worker's
// Flags derives from this and sets its own default mode.
struct MemberFlags {
  std::string socket, mesh, mode;
  int members = 2, member = 0;
};

// When `arg` is one of MemberFlags' flags: stores it, true. Otherwise false.
inline bool ParseMemberFlag(const std::string& arg, MemberFlags* f) {
  std::string v;
  if (FlagValue(arg, "socket", &f->socket) || FlagValue(arg, "mesh", &f->mesh) ||
      FlagValue(arg, "mode", &f->mode)) {
    return true;
  }
  if (FlagValue(arg, "members", &v)) {
    f->members = std::atoi(v.c_str());
    return true;
  }
  if (FlagValue(arg, "member", &v)) {
    f->member = std::atoi(v.c_str());
    return true;
  }
  return false;
}

}  // namespace collectived::testing

#endif  // COLLECTIVED_TESTS_HARNESS_FLAGS_H_
