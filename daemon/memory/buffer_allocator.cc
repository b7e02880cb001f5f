#include "daemon/memory/buffer_allocator.h"

#include "absl/strings/str_cat.h"

namespace collectived {
namespace {

class MemfdAllocator final : public BufferAllocator {
 public:
  absl::string_view kind() const override { return "memfd"; }
  absl::Status Viable() const override { return absl::OkStatus(); }
  absl::StatusOr<std::shared_ptr<SharedBuffer>> Allocate(size_t bytes,
                                                         const DeviceSpec& device) override {
    if (device.kind != DeviceSpec::Kind::kCpu) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the host (memfd) allocator allocates on device cpu only, not ", device.ToString()));
    }
    return CreateMemfdBuffer(bytes);
  }
};

}  // namespace

std::unique_ptr<BufferAllocator> MakeMemfdAllocator() { return std::make_unique<MemfdAllocator>(); }

}  // namespace collectived
