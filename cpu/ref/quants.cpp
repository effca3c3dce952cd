// Generic entry points: dtype -> row function, with argument checks and
// support for unaligned buffers (tensor data in a mapped file need not be
// aligned for the block struct).
#include "cpu/ref/quants.h"

#include <cstdint>
#include <cstring>

namespace loom::ref {
namespace {

bool is_aligned(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// Row functions of one storage type: `Unit` is a block struct, or the
// element type of a plain format (block of one element).
template <typename Unit>
struct RowFns {
  void (*dequantize)(const Unit*, float*, int64_t);
  void (*quantize)(const float*, Unit*, int64_t);
  int64_t block_size;
};

// Runs a dequantizer on `src` of any alignment: directly when aligned,
// otherwise one block at a time through an aligned copy.
template <typename Unit>
void dequantize_any(const RowFns<Unit>& fns, const void* src, float* dst, int64_t n) {
  if (is_aligned(src, alignof(Unit))) {
    fns.dequantize(static_cast<const Unit*>(src), dst, n);
    return;
  }
  const auto* bytes = static_cast<const uint8_t*>(src);
  for (int64_t b = 0; b < n / fns.block_size; ++b) {
    Unit unit;
    std::memcpy(&unit, bytes + b * static_cast<int64_t>(sizeof(Unit)), sizeof(Unit));
    fns.dequantize(&unit, dst + b * fns.block_size, fns.block_size);
  }
}

template <typename Unit>
void quantize_any(const RowFns<Unit>& fns, const float* src, void* dst, int64_t n) {
  if (is_aligned(dst, alignof(Unit))) {
    fns.quantize(src, static_cast<Unit*>(dst), n);
    return;
  }
  auto* bytes = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / fns.block_size; ++b) {
    Unit unit;
    fns.quantize(src + b * fns.block_size, &unit, fns.block_size);
    std::memcpy(bytes + b * static_cast<int64_t>(sizeof(Unit)), &unit, sizeof(Unit));
  }
}

template <typename Unit>
constexpr RowFns<Unit> fns(void (*deq)(const Unit*, float*, int64_t),
                           void (*q)(const float*, Unit*, int64_t), int64_t block_size) {
  return RowFns<Unit>{deq, q, block_size};
}

// Calls `f` with the RowFns of `t`; returns false for a dtype without a reference.
template <typename F>
bool with_row_fns(DType t, F&& f) {
  switch (t) {
    case DType::kF32: f(fns<float>(dequantize_row_f32, quantize_row_f32, 1)); return true;
    case DType::kF16: f(fns<uint16_t>(dequantize_row_f16, quantize_row_f16, 1)); return true;
    case DType::kBF16: f(fns<uint16_t>(dequantize_row_bf16, quantize_row_bf16, 1)); return true;
    case DType::kQ4_0: f(fns<BlockQ4_0>(dequantize_row_q4_0, quantize_row_q4_0, kQK)); return true;
    case DType::kQ4_1: f(fns<BlockQ4_1>(dequantize_row_q4_1, quantize_row_q4_1, kQK)); return true;
    case DType::kQ5_0: f(fns<BlockQ5_0>(dequantize_row_q5_0, quantize_row_q5_0, kQK)); return true;
    case DType::kQ5_1: f(fns<BlockQ5_1>(dequantize_row_q5_1, quantize_row_q5_1, kQK)); return true;
    case DType::kQ8_0: f(fns<BlockQ8_0>(dequantize_row_q8_0, quantize_row_q8_0, kQK)); return true;
    case DType::kQ2_K:
      f(fns<BlockQ2_K>(dequantize_row_q2_k, quantize_row_q2_k, kQK_K));
      return true;
    case DType::kQ3_K:
      f(fns<BlockQ3_K>(dequantize_row_q3_k, quantize_row_q3_k, kQK_K));
      return true;
    case DType::kQ4_K:
      f(fns<BlockQ4_K>(dequantize_row_q4_k, quantize_row_q4_k, kQK_K));
      return true;
    case DType::kQ5_K:
      f(fns<BlockQ5_K>(dequantize_row_q5_k, quantize_row_q5_k, kQK_K));
      return true;
    case DType::kQ6_K:
      f(fns<BlockQ6_K>(dequantize_row_q6_k, quantize_row_q6_k, kQK_K));
      return true;
    case DType::kQ8_K:
      f(fns<BlockQ8_K>(dequantize_row_q8_k, quantize_row_q8_k, kQK_K));
      return true;
    default: return false;
  }
}

// Checks what both directions share; `what` names the caller in messages.
Status check_args(const char* what, DType t, const void* src, const void* dst, int64_t n) {
  const DTypeTraits& tr = traits(t);
  if (!has_reference(t)) {
    return make_error(ErrorCode::kUnsupported, "%s: no reference implementation for dtype %.*s",
                      what, static_cast<int>(tr.name.size()), tr.name.data());
  }
  if (n < 0) {
    return make_error(ErrorCode::kInvalidArgument, "%s: negative element count %lld", what,
                      static_cast<long long>(n));
  }
  if (n % tr.block_size != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "%s: %lld elements is not a multiple of the %.*s block size %u", what,
                      static_cast<long long>(n), static_cast<int>(tr.name.size()), tr.name.data(),
                      tr.block_size);
  }
  if (n > 0 && (src == nullptr || dst == nullptr)) {
    return make_error(ErrorCode::kInvalidArgument, "%s: null buffer for %lld elements", what,
                      static_cast<long long>(n));
  }
  return Status::ok_status();
}

}  // namespace

bool has_reference(DType t) {
  return with_row_fns(t, [](const auto&) {});
}

Status dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  LOOM_TRY(check_args("dequantize_row", t, src, dst, n));
  if (n == 0) return Status::ok_status();
  with_row_fns(t, [&](const auto& f) { dequantize_any(f, src, dst, n); });
  return Status::ok_status();
}

Status quantize_row(DType t, const float* src, void* dst, int64_t n) {
  LOOM_TRY(check_args("quantize_row", t, src, dst, n));
  if (n == 0) return Status::ok_status();
  with_row_fns(t, [&](const auto& f) { quantize_any(f, src, dst, n); });
  return Status::ok_status();
}

}  // namespace loom::ref
