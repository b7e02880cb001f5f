// The XLA FFI handler behind collectived.jax: one custom call target,
// "collectived_collective", runs any collective of a registered mesh on a
// CPU operand inside a jitted JAX function. XLA calls it on one of its
// threads, without the GIL: it only touches C++ objects.
//
// Per call: copy the operand into the mesh's staging buffer (shared memory,
// grown on demand), run the op through the C++ SDK (in place when the
// result has the operand's bytes and dtype, else into a second staging
// buffer), wait for it (the mesh's op timeout plus grace at most), copy the
// result into XLA's output. Errors return to JAX as XlaRuntimeError with the
// status code's name and the daemon's message.
#include "bridge.h"

#ifdef COLLECTIVED_HAVE_JAX_FFI

#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "xla/ffi/api/ffi.h"

namespace collectived::python {
namespace {

namespace ffi = xla::ffi;

// The op kind of jax.py's axis_index: answered here, the daemon is not asked.
constexpr int32_t kAxisIndexKind = 100;

ffi::Error FromStatus(const absl::Status& status) {
  // XLA puts the code's name in front of the message.
  return ffi::Error(static_cast<ffi::ErrorCode>(status.code()), std::string(status.message()));
}

// collectived's DType of an XLA element type; kInvalid for the others.
DType DTypeOf(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return DType::kF32;
    case ffi::DataType::F64: return DType::kF64;
    case ffi::DataType::F16: return DType::kF16;
    case ffi::DataType::BF16: return DType::kBF16;
    case ffi::DataType::S8: return DType::kI8;
    case ffi::DataType::U8: return DType::kU8;
    case ffi::DataType::S32: return DType::kI32;
    case ffi::DataType::U32: return DType::kU32;
    case ffi::DataType::S64: return DType::kI64;
    case ffi::DataType::U64: return DType::kU64;
    case ffi::DataType::PRED: return DType::kBool;
    case ffi::DataType::F8E4M3FN: return DType::kF8E4M3FN;
    case ffi::DataType::F8E5M2: return DType::kF8E5M2;
    default: return DType::kInvalid;
  }
}

// Makes `buffer` at least `bytes` long (a new buffer, twice the size, when
// it is not; the old one is freed).
absl::Status Grow(Client& client, Buffer& buffer, size_t bytes) {
  if (buffer.valid() && buffer.size() >= bytes) return absl::OkStatus();
  size_t size = 4096;
  while (size < bytes) size *= 2;
  absl::StatusOr<Buffer> grown = client.Allocate(size);
  if (!grown.ok()) return grown.status();
  if (buffer.valid()) client.Free(buffer).IgnoreError();  // the session end frees it otherwise
  buffer = std::move(*grown);
  return absl::OkStatus();
}

ffi::Error RunCollective(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out, int64_t mesh_handle,
                         int32_t kind, std::string_view axes, int64_t a, int64_t b, bool tiled,
                         ffi::Span<const int64_t> perm) {
  std::shared_ptr<MeshEntry> entry = FindMesh(mesh_handle);
  if (entry == nullptr) {
    return FromStatus(absl::FailedPreconditionError(absl::StrCat(
        "the collectived mesh this function was traced with (handle ", mesh_handle,
        ") has been left or garbage-collected")));
  }
  std::vector<std::string> names;
  if (!axes.empty()) names = absl::StrSplit(absl::string_view(axes.data(), axes.size()), ',');
  if (kind == kAxisIndexKind) {
    // jax.lax.axis_index, read at run time: the traced program stays the same
    // in every process (an index baked in as a constant would not).
    const int index = entry->mesh->axis_index(AxisNames(names));
    if (index < 0) {
      return FromStatus(absl::InvalidArgumentError(
          absl::StrCat("mesh '", entry->mesh->name(), "' has no axis '",
                       absl::string_view(axes.data(), axes.size()), "'")));
    }
    if (out->element_type() != ffi::DataType::S32 || out->element_count() != 1) {
      return FromStatus(absl::InvalidArgumentError("axis_index returns one int32"));
    }
    *static_cast<int32_t*>(out->untyped_data()) = index;
    return ffi::Error::Success();
  }
  std::shared_ptr<Client> client = entry->client.lock();
  if (client == nullptr) return FromStatus(absl::FailedPreconditionError("the client is closed"));
  const DType in_dt = DTypeOf(x.element_type());
  const DType out_dt = DTypeOf(out->element_type());
  if (in_dt == DType::kInvalid || out_dt == DType::kInvalid) {
    return FromStatus(absl::InvalidArgumentError("collectived does not support this dtype"));
  }
  if (perm.size() % 2 != 0) {
    return FromStatus(absl::InvalidArgumentError("perm must hold (source, dest) pairs"));
  }
  Collective args;
  args.kind = static_cast<CollectiveKind>(kind);
  args.axis = static_cast<int>(a);
  args.concat_axis = static_cast<int>(b);
  args.tiled = tiled;
  args.axes = AxisNames(std::move(names));
  for (size_t i = 0; i < perm.size(); i += 2) {
    args.perm.emplace_back(static_cast<int>(perm[i]), static_cast<int>(perm[i + 1]));
  }
  const size_t in_bytes = x.size_bytes();
  const size_t out_bytes = out->size_bytes();
  const bool in_place = args.kind != CollectiveKind::kAllGather &&
                        args.kind != CollectiveKind::kPsumScatter && in_dt == out_dt &&
                        in_bytes == out_bytes;

  absl::MutexLock lock(&entry->mu);
  if (absl::Status st = Grow(*client, entry->in, in_bytes); !st.ok()) return FromStatus(st);
  if (!in_place) {
    if (absl::Status st = Grow(*client, entry->out, out_bytes); !st.ok()) return FromStatus(st);
  }
  if (in_bytes > 0) std::memcpy(entry->in.data(), x.untyped_data(), in_bytes);
  auto dims = [](ffi::AnyBuffer::Dimensions d) { return std::vector<int64_t>(d.begin(), d.end()); };
  args.x = Array{&entry->in, 0, in_dt, dims(x.dimensions())};
  if (!in_place) args.out = Array{&entry->out, 0, out_dt, dims(out->dimensions())};
  // Synchronous: a small op may run among the members (Mesh::run).
  if (absl::Status st = entry->mesh->run(args); !st.ok()) return FromStatus(st);
  const Buffer& result = in_place ? entry->in : entry->out;
  if (out_bytes > 0) std::memcpy(out->untyped_data(), result.data(), out_bytes);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivedCollective, RunCollective,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("mesh")
                                  .Attr<int32_t>("kind")
                                  .Attr<std::string_view>("axes")
                                  .Attr<int64_t>("a")
                                  .Attr<int64_t>("b")
                                  .Attr<bool>("tiled")
                                  .Attr<ffi::Span<const int64_t>>("perm"));

void* JaxFfiHandler() { return reinterpret_cast<void*>(&CollectivedCollective); }

}  // namespace collectived::python

#else  // !COLLECTIVED_HAVE_JAX_FFI

namespace collectived::python {
void* JaxFfiHandler() { return nullptr; }
}  // namespace collectived::python

#endif
