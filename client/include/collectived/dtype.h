// Element types of collectived buffers and their conversions (public SDK
// header; the daemon uses the same definitions).
//
// Thread-safety: every function here is pure and safe to call concurrently.
#ifndef COLLECTIVED_DTYPE_H_
#define COLLECTIVED_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

namespace collectived {

// The element types of the wire API. Values match proto `collectived.v1.DType`.
enum class DType : uint8_t {
  kInvalid = 0,
  kF32 = 1,
  kF64 = 2,
  kF16 = 3,
  kBF16 = 4,
  kI8 = 5,
  kU8 = 6,
  kI32 = 7,
  kU32 = 8,
  kI64 = 9,
  kU64 = 10,
  kBool = 11,
};

// Size of one element in bytes; 0 for kInvalid.
size_t DTypeSize(DType dt);
// JAX/numpy spelling: "float32", "bfloat16", "bool", ... ("invalid" for kInvalid).
std::string_view DTypeName(DType dt);
// Inverse of DTypeName; nullopt for unknown names (and for "invalid").
std::optional<DType> DTypeFromName(std::string_view name);
// Short spelling used in error messages: "f32", "bf16", "i8", "u64", "bool".
std::string_view DTypeShortName(DType dt);
bool IsFloat(DType dt);    // f32, f64, f16, bf16
bool IsInteger(DType dt);  // signed or unsigned integers (not bool)

// IEEE binary16 <-> binary32. FloatToHalf rounds to nearest even, overflows to
// inf and keeps NaN a (quiet) NaN.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
// bfloat16 <-> binary32. FloatToBF16 rounds to nearest even and keeps NaN a
// (quiet) NaN.
float BF16ToFloat(uint16_t b);
uint16_t FloatToBF16(float f);

// The DType of a C++ element type: DTypeOf<float>() == DType::kF32. float16
// and bfloat16 have no C++ type here; name them with DType::kF16/kBF16 and
// store their bits as uint16_t.
template <typename T>
constexpr DType DTypeOf() {
  if constexpr (std::is_same_v<T, float>) return DType::kF32;
  else if constexpr (std::is_same_v<T, double>) return DType::kF64;
  else if constexpr (std::is_same_v<T, int8_t>) return DType::kI8;
  else if constexpr (std::is_same_v<T, uint8_t>) return DType::kU8;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::kI32;
  else if constexpr (std::is_same_v<T, uint32_t>) return DType::kU32;
  else if constexpr (std::is_same_v<T, int64_t>) return DType::kI64;
  else if constexpr (std::is_same_v<T, uint64_t>) return DType::kU64;
  else if constexpr (std::is_same_v<T, bool>) return DType::kBool;
  else static_assert(sizeof(T) == 0, "no collectived DType for this C++ type");
}

}  // namespace collectived

#endif  // COLLECTIVED_DTYPE_H_
