// The op header the hosts of a mesh exchange (host_op_header.h): made from
// a plan, read back from bytes, compared, and judged as every host judges
// it.

#include "daemon/cluster/host_op_header.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

namespace collectived {
namespace host_header {
namespace {

OpPlan PsumPlan() {
  OpPlan p;
  p.kind = OpKind::kPsum;
  p.dtype = DType::kF32;
  p.out_dtype = DType::kF32;
  p.in_shape = {4};
  p.out_shape = {4};
  p.in_bytes = 16;
  p.out_bytes = 16;
  p.axis_ids = {0};
  p.group_size = 2;
  p.groups = {{0, 1}};
  p.group_of = {0, 0};
  p.index_in_group = {0, 1};
  p.signature = "psum f32[4] over (x)";
  return p;
}

MeshTopology Topology() {
  MeshTopology t;
  t.hosts = {"h0", "h1"};
  t.member_host = {"h0", "h1"};
  t.self = 0;
  return t;
}

WireHeader Header(const OpPlan& plan, int64_t sequence, const absl::Status& verdict = {}) {
  return MakeHeader(plan, Topology(), sequence, 1, HostMeshOptions{}, "memfd", verdict);
}

std::array<uint8_t, kHeaderCapacity> Bytes(const void* p, size_t n) {
  std::array<uint8_t, kHeaderCapacity> raw{};
  std::memcpy(raw.data(), p, n);
  return raw;
}

const std::vector<std::string> kHosts = {"h0", "h1"};

TEST(HostOpHeaderTest, AHeaderReadBackIsTheOneSentAndAgreesWithItself) {
  const WireHeader h = Header(PsumPlan(), 7);
  const WireHeader back = ParseHeader(Bytes(&h, sizeof(h)), sizeof(h));
  EXPECT_EQ(std::memcmp(&h, &back, sizeof(h)), 0);
  EXPECT_EQ(Differences(h, back), "");
  const Verdict v = Judge({h, back}, kHosts, 7);
  EXPECT_TRUE(v.status.ok()) << v.status;
  EXPECT_FALSE(v.broken);
  EXPECT_EQ(Text(h.signature, sizeof(h.signature)), "psum f32[4] over (x)");
}

TEST(HostOpHeaderTest, ARefusalNamesItsHostAndReasonAndKeepsTheMesh) {
  const WireHeader ok = Header(PsumPlan(), 3);
  const WireHeader refused =
      Header(PsumPlan(), 3, absl::InvalidArgumentError("buffer 9 is not this session's"));
  const Verdict v = Judge({ok, refused}, kHosts, 3);
  EXPECT_EQ(v.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(v.status.message(),
            "op 3 of the mesh: host h1 refused it: buffer 9 is not this session's");
  EXPECT_FALSE(v.broken);
}

TEST(HostOpHeaderTest, DifferentOpsNameBothHostsAndWhatDiffers) {
  OpPlan other = PsumPlan();
  other.kind = OpKind::kPmax;
  other.signature = "pmax f32[4] over (x)";
  const Verdict v = Judge({Header(PsumPlan(), 5), Header(other, 5)}, kHosts, 5);
  EXPECT_EQ(v.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(v.status.message(),
            "op 5 of the mesh: the hosts submitted different ops: host h1 submitted pmax f32[4] "
            "over (x) where host h0 submitted psum f32[4] over (x) (kind, plan (groups, "
            "permutation, axes or shapes) or mesh layout differ)");
  EXPECT_FALSE(v.broken);
}

TEST(HostOpHeaderTest, APlanThatDiffersOnlyInItsGroupsIsCaughtByTheHash) {
  OpPlan swapped = PsumPlan();
  swapped.groups = {{1, 0}};
  swapped.index_in_group = {1, 0};
  EXPECT_NE(PlanHash(PsumPlan(), Topology()), PlanHash(swapped, Topology()));
  EXPECT_EQ(Differences(Header(PsumPlan(), 1), Header(swapped, 1)),
            "plan (groups, permutation, axes or shapes) or mesh layout");
}

TEST(HostOpHeaderTest, HostsAtDifferentOpCountsBreakTheMeshEvenWhenOneRefused) {
  const WireHeader refused = Header(PsumPlan(), 4, absl::InternalError("no"));
  const Verdict v = Judge({Header(PsumPlan(), 4), refused, Header(PsumPlan(), 5)},
                          {"h0", "h1", "h2"}, 4);
  EXPECT_EQ(v.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(v.broken);
  EXPECT_NE(v.status.message().find("host h2 submitted psum f32[4] over (x) where host h0 "
                                    "submitted psum f32[4] over (x) (op 5 where op 4)"),
            std::string::npos)
      << v.status;
  EXPECT_NE(v.status.message().find("so the mesh breaks (join again)"), std::string::npos);
}

TEST(HostOpHeaderTest, BytesOfAnotherWireFormatAreNamedAndReadNoFurther) {
  WireHeader h = Header(PsumPlan(), 2);
  h.version = kVersion + 1;
  const WireHeader other = ParseHeader(Bytes(&h, sizeof(h)), sizeof(h));
  EXPECT_EQ(other.sequence, -1);
  EXPECT_EQ(Text(other.signature, sizeof(other.signature)),
            absl::StrCat("an op in another wire format (version ", kVersion + 1, ", ",
                         sizeof(WireHeader), " bytes; this build's: version ", kVersion, ", ",
                         sizeof(WireHeader), ")"));
  EXPECT_EQ(Differences(other, Header(PsumPlan(), 2)), "wire version");
  const Verdict v = Judge({Header(PsumPlan(), 2), other}, kHosts, 2);
  EXPECT_TRUE(v.broken);

  // Fewer bytes than a header, with this build's lead: still another format.
  const WireHeader good = Header(PsumPlan(), 2);
  const WireHeader cut = ParseHeader(Bytes(&good, 64), 64);
  EXPECT_FALSE(SameWireFormat(cut, good));
}

TEST(HostOpHeaderTest, TextFieldsAreTruncatedAndTerminated) {
  char field[8];
  CopyText(field, sizeof(field), "a long reason");
  EXPECT_EQ(Text(field, sizeof(field)), "a long ");
  EXPECT_EQ(field[7], '\0');
}

}  // namespace
}  // namespace host_header
}  // namespace collectived
