// Flags of the test worker processes: "--name=value" arguments.
#ifndef COLLECTIVED_TESTS_HARNESS_FLAGS_H_
#define COLLECTIVED_TESTS_HARNESS_FLAGS_H_

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

}  // namespace collectived::testing

#endif  // COLLECTIVED_TESTS_HARNESS_FLAGS_H_
