#include "daemon/cluster/mesh_registry.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/util/random_id.h"

namespace collectived {

std::string MeshName(absl::string_view key, int64_t generation) {
  return absl::StrCat("mesh '", key, "' generation ", generation);
}

// A list of `total` items for an error text (`items`: at least the first
// kRegistryNamed of them, or all): at most kRegistryNamed named, then how many more.
std::string BoundedList(const std::vector<std::string>& items, size_t total) {
  const size_t named = std::min({items.size(), total, kRegistryNamed});
  std::string text = absl::StrJoin(items.begin(), items.begin() + named, ", ");
  if (total > named) absl::StrAppend(&text, " and ", total - named, " more");
  return text;
}
std::string BoundedList(const std::vector<std::string>& items) {
  return BoundedList(items, items.size());
}

std::string TokenDigest(absl::string_view token) {
  if (token.empty()) return "";
  const std::string salted = absl::StrCat("collectived join token v1:", token);
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(salted.data()), salted.size(), md);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(md), sizeof(md)));
}

absl::Status ValidateMeshGeneration(int64_t generation) {
  if (generation < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("generation is ", generation, "; generations start at 1"));
  }
  return absl::OkStatus();
}

absl::Status ValidateMeshRegistration(const MeshRegistration& r) {
  if (absl::Status st = ValidateKey(r.key); !st.ok()) return st;
  if (absl::Status st = ValidateHostId(r.host_id); !st.ok()) return st;
  if (r.lease_id.empty()) return absl::InvalidArgumentError("lease_id is empty");
  if (r.axes.empty()) return absl::InvalidArgumentError("axes is empty");
  if (r.axes.size() > kMaxMeshAxesLength) {
    return absl::InvalidArgumentError(absl::StrCat("axes is ", r.axes.size(),
                                                   " characters long; at most ",
                                                   kMaxMeshAxesLength, " are allowed"));
  }
  if (std::string bad = FirstBadChar(r.axes, [](char c) { return c >= 0x20 && c < 0x7f; });
      !bad.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("axes has ", bad, "; only printable characters are allowed"));
  }
  if (r.members < 1 || r.members > kMaxMeshMembers) {
    return absl::InvalidArgumentError(
        absl::StrCat("members is ", r.members, "; it must be 1..", kMaxMeshMembers));
  }
  if (r.token.size() > kMaxMeshTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token is ", r.token.size(), " bytes; at most ", kMaxMeshTokenBytes, " are allowed"));
  }
  if (r.op_timeout_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("op_timeout_ms is ", r.op_timeout_ms, "; it must be >= 0"));
  }
  if (r.indices.empty()) return absl::InvalidArgumentError("indices is empty");
  if (r.indices.size() > kMaxKeysPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("indices has ", r.indices.size(),
                                                   " entries; at most ", kMaxKeysPerRequest,
                                                   " are allowed"));
  }
  std::set<int32_t> seen;
  for (int32_t i : r.indices) {
    if (i < 0 || i >= r.members) {
      return absl::InvalidArgumentError(absl::StrCat("index ", i, " is out of range: the mesh has ",
                                                     r.members, " members (0..", r.members - 1,
                                                     ")"));
    }
    if (!seen.insert(i).second) {
      return absl::InvalidArgumentError(absl::StrCat("index ", i, " is repeated"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateMeshLeave(absl::string_view key, int64_t generation,
                               const std::vector<int32_t>& indices, absl::string_view reason) {
  if (absl::Status st = ValidateKey(key); !st.ok()) return st;
  if (absl::Status st = ValidateMeshGeneration(generation); !st.ok()) return st;
  if (indices.size() > kMaxKeysPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("indices has ", indices.size(),
                                                   " entries; at most ", kMaxKeysPerRequest,
                                                   " are allowed"));
  }
  if (reason.size() > kMaxMeshReasonBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reason is ", reason.size(), " bytes; at most ", kMaxMeshReasonBytes, " are allowed"));
  }
  return absl::OkStatus();
}

absl::Status CheckRegistration(absl::string_view key, const RegistryGeneration& gen,
                               const MeshRegistration& reg) {
  const std::string name = MeshName(key, gen.number);
  const std::string digest = TokenDigest(reg.token);
  if (digest.size() != gen.token_digest.size() ||
      CRYPTO_memcmp(digest.data(), gen.token_digest.data(), digest.size()) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("mesh '", key, "' needs the join token its first member set (host ",
                     gen.first_host, ")"));
  }
  if (reg.axes != gen.axes || reg.members != gen.members) {
    std::vector<std::string> asks;
    if (reg.axes != gen.axes) asks.push_back(absl::StrCat("(", reg.axes, ")"));
    if (reg.members != gen.members) asks.push_back(absl::StrCat(reg.members, " members"));
    return absl::FailedPreconditionError(absl::StrCat(
        name, " is ", gen.full() ? "ready" : "forming", " with axes (", gen.axes, ") and ",
        gen.members, " members (first registered by host ", gen.first_host, "); host ",
        reg.host_id, " asks for ", absl::StrJoin(asks, " and ")));
  }
  if (reg.op_timeout_ms != 0 && gen.op_timeout_ms != 0 && reg.op_timeout_ms != gen.op_timeout_ms) {
    return absl::FailedPreconditionError(absl::StrCat(
        name, " has op timeout ", gen.op_timeout_ms, " ms (asked by host ", gen.op_timeout_host,
        "); host ", reg.host_id, " asks for ", reg.op_timeout_ms, " ms"));
  }
  if (gen.full()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " is already full (", gen.members, " members)"));
  }
  for (int32_t i : reg.indices) {
    if (auto taken = gen.member_host.find(i); taken != gen.member_host.end()) {
      return absl::AlreadyExistsError(absl::StrCat("member ", i, " of ", name,
                                                   " is already registered by host ",
                                                   taken->second));
    }
  }
  return absl::OkStatus();
}

RegistryGeneration StartGeneration(int64_t number, const MeshRegistration& reg) {
  RegistryGeneration gen;
  gen.number = number;
  gen.axes = reg.axes;
  gen.members = reg.members;
  gen.token_digest = TokenDigest(reg.token);
  gen.first_host = reg.host_id;
  gen.secret = RandomBytes(kMeshSecretBytes);
  return gen;
}

void AddRegistration(RegistryGeneration& gen, const MeshRegistration& reg) {
  if (gen.op_timeout_ms == 0 && reg.op_timeout_ms != 0) {
    gen.op_timeout_ms = reg.op_timeout_ms;
    gen.op_timeout_host = reg.host_id;
  }
  for (int32_t i : reg.indices) gen.member_host[i] = reg.host_id;
  gen.host_members[reg.host_id] += static_cast<int64_t>(reg.indices.size());
}

bool RemoveRegistrations(RegistryGeneration& gen, absl::string_view host,
                         const std::vector<int32_t>& indices) {
  for (int32_t i : indices) {
    auto m = gen.member_host.find(i);
    if (m == gen.member_host.end() || m->second != host) continue;
    gen.member_host.erase(m);
    if (auto h = gen.host_members.find(std::string(host));
        h != gen.host_members.end() && --h->second == 0) {
      gen.host_members.erase(h);
    }
  }
  return gen.member_host.empty();
}

absl::Status NotFullError(absl::string_view key, const RegistryGeneration& gen) {
  // Both lists are bounded (the text travels in the answer's trailers,
  // which clients limit to a few KiB); so is the work: the scan stops at the
  // kRegistryNamed-th missing index.
  std::vector<std::string> missing;
  for (int64_t i = 0; i < gen.members && missing.size() < kRegistryNamed; ++i) {
    if (gen.member_host.count(static_cast<int32_t>(i)) == 0) missing.push_back(absl::StrCat(i));
  }
  std::string text = absl::StrCat(
      MeshName(key, gen.number), " did not fill before the deadline: ", gen.member_host.size(),
      " of ", gen.members, " members registered; missing ",
      BoundedList(missing, static_cast<size_t>(gen.members) - gen.member_host.size()));
  std::vector<std::string> by_host;
  for (const auto& [id, count] : gen.host_members) {
    by_host.push_back(absl::StrCat(id, " (", count, ")"));
  }
  absl::StrAppend(&text, "; registered by ",
                  by_host.empty() ? std::string("no host") : BoundedList(by_host));
  return absl::DeadlineExceededError(text);
}

MeshMembership MembershipOf(const RegistryGeneration& gen,
                            const std::function<HostRecord(const std::string&)>& host) {
  MeshMembership m;
  m.generation = gen.number;
  m.op_timeout_ms = gen.op_timeout_ms;
  m.secret = gen.secret;
  m.member_host.reserve(gen.member_host.size());
  for (const auto& [index, id] : gen.member_host) m.member_host.push_back(id);
  for (const auto& [id, count] : gen.host_members) {
    HostRecord r = host(id);
    r.host_id = id;
    m.hosts.push_back(std::move(r));
  }
  return m;
}

}  // namespace collectived
