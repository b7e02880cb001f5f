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
  // 8-bit floats (one byte per element), as ml_dtypes/JAX define them:
  // float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
  //   infinities; the only NaNs are S.1111.111 (0x7f, 0xff); largest finite
  //   value 448; subnormals down to 2^-9.
  // float8_e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like
  //   (the top byte of a float16): +-inf (0x7c, 0xfc), NaNs 0x7d..0x7f and
  //   0xfd..0xff; largest finite value 57344; subnormals down to 2^-16.
  kF8E4M3FN = 12,
  kF8E5M2 = 13,
};

// Size of one element in bytes (a power of two); 0 for kInvalid and for
// values outside the enum. Inline: every op asks, several times.
constexpr size_t DTypeSize(DType dt) {
  constexpr uint8_t kSizes[] = {0, 4, 8, 2, 2, 1, 1, 4, 4, 8, 8, 1, 1, 1};
  const size_t i = static_cast<size_t>(dt);
  return i < sizeof(kSizes) ? kSizes[i] : 0;
}
// JAX/numpy spelling: "float32", "bfloat16", "float8_e4m3fn", "float8_e5m2",
// "bool", ... ("invalid" for kInvalid).
std::string_view DTypeName(DType dt);
// Inverse of DTypeName; nullopt for unknown names (and for "invalid").
std::optional<DType> DTypeFromName(std::string_view name);
// Short spelling used in error messages: "f32", "bf16", "f8e4m3fn",
// "f8e5m2", "i8", "u64", "bool".
std::string_view DTypeShortName(DType dt);
bool IsFloat(DType dt);    // f32, f64, f16, bf16, f8e4m3fn, f8e5m2
bool IsInteger(DType dt);  // signed or unsigned integers (not bool)

// IEEE binary16 <-> binary32. FloatToHalf rounds to nearest even, overflows to
// inf and keeps NaN a (quiet) NaN.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
// bfloat16 <-> binary32. FloatToBF16 rounds to nearest even and keeps NaN a
// (quiet) NaN.
float BF16ToFloat(uint16_t b);
uint16_t FloatToBF16(float f);
// float8_e4m3fn <-> binary32, bit for bit as ml_dtypes converts.
// F8E4M3FNToFloat is exact; a NaN (0x7f, 0xff) gives the quiet NaN of its
// sign (0x7fc00000, 0xffc00000). FloatToF8E4M3FN rounds to nearest even,
// keeps subnormals (2^-10 rounds to 0, just above it to 0x01); a magnitude
// that rounds above 448 (from 464 exclusive: 464 itself ties to 448), an
// infinity and a NaN all give the NaN of the input's sign (0x7f / 0xff).
float F8E4M3FNToFloat(uint8_t b);
uint8_t FloatToF8E4M3FN(float f);
// float8_e5m2 <-> binary32, bit for bit as ml_dtypes converts.
// F8E5M2ToFloat is exact; any NaN gives the quiet NaN of its sign (payload
// dropped). FloatToF8E5M2 rounds to nearest even, keeps subnormals; a
// magnitude from 61440 (halfway from 57344 to 2^16) up overflows to the
// infinity of its sign; a NaN gives sign | 0x7e.
float F8E5M2ToFloat(uint8_t b);
uint8_t FloatToF8E5M2(float f);

// The DType of a C++ element type: DTypeOf<float>() == DType::kF32. float16,
// bfloat16 and the float8 types have no C++ type here; name them with
// DType::kF16/kBF16 (bits stored as uint16_t) and DType::kF8E4M3FN/kF8E5M2
// (bits stored as uint8_t).
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
