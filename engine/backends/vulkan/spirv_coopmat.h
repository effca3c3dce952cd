// SPIR-V rewrite from VK_NV_cooperative_matrix to VK_KHR_cooperative_matrix.
//
// Debian 12's glslang (11.13) compiles GL_NV_cooperative_matrix but not
// GL_KHR_cooperative_matrix, and its GL_EXT_spirv_intrinsics cannot spell the
// KHR matrix type (spirv_type takes constant expressions only, and
// OpTypeCooperativeMatrixKHR's component type is a type <id>). So the
// tensor-core shaders (mul_mat_cm.comp, attn_cm.comp) are written once
// against the NV extension, and for devices that have only the KHR one (AMD,
// Intel, newer drivers) their SPIR-V is rewritten when the pipeline is made:
//
// - the capability, the extension string and the five NV opcodes map to
//   their KHR twins (loads and stores take a memory-layout constant where NV
//   took a column-major bool, and the stride moves after it);
// - a KHR matrix type carries its use (A, B or accumulator) where the NV type
//   served all three, so each NV type is split by use: every value, variable
//   and access chain that a matrix flows through (loads, stores, phis, copies)
//   is put in one class with union-find, a class takes the use of the
//   OpCooperativeMatrixMulAddNV operand it reaches, and its ids are retyped to
//   a clone of the NV type (and of the arrays and pointers around it) for that
//   use. A class that reaches two uses, or an instruction the rewrite does not
//   know carrying a matrix, makes it fail with the reason.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace loom::vk {

/// Whether `words` (a SPIR-V module) declares the CooperativeMatrixNV capability.
bool spirv_uses_nv_coopmat(std::span<const uint32_t> words);

/// The module with VK_NV_cooperative_matrix replaced by VK_KHR_cooperative_matrix,
/// or an error naming what could not be mapped.
Result<std::vector<uint32_t>> spirv_nv_coopmat_to_khr(std::span<const uint32_t> words);

}  // namespace loom::vk
