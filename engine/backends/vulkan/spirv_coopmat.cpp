#include "engine/backends/vulkan/spirv_coopmat.h"

#include <bit>
#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>

namespace loom::vk {
namespace {

// Opcodes and enumerants (SPIR-V 1.6 unified specification, SPV_NV_ and
// SPV_KHR_cooperative_matrix).
enum Op : uint32_t {
  kOpUndef = 1,
  kOpSource = 3,
  kOpSourceExtension = 4,
  kOpName = 5,
  kOpMemberName = 6,
  kOpString = 7,
  kOpLine = 8,
  kOpExtension = 10,
  kOpExtInstImport = 11,
  kOpMemoryModel = 14,
  kOpEntryPoint = 15,
  kOpExecutionMode = 16,
  kOpCapability = 17,
  kOpTypeInt = 21,
  kOpTypeFloat = 22,
  kOpTypeVector = 23,
  kOpTypeArray = 28,
  kOpTypeRuntimeArray = 29,
  kOpTypeStruct = 30,
  kOpTypePointer = 32,
  kOpConstantTrue = 41,
  kOpConstantFalse = 42,
  kOpConstant = 43,
  kOpConstantComposite = 44,
  kOpConstantNull = 46,
  kOpSpecConstant = 50,
  kOpFunction = 54,
  kOpFunctionParameter = 55,
  kOpFunctionCall = 57,
  kOpVariable = 59,
  kOpLoad = 61,
  kOpStore = 62,
  kOpAccessChain = 65,
  kOpInBoundsAccessChain = 66,
  kOpDecorate = 71,
  kOpMemberDecorate = 72,
  kOpCompositeConstruct = 80,
  kOpCompositeExtract = 81,
  kOpCompositeInsert = 82,
  kOpCopyObject = 83,
  kOpFConvert = 115,
  kOpFNegate = 127,
  kOpFAdd = 129,
  kOpFSub = 131,
  kOpFMul = 133,
  kOpFDiv = 136,
  kOpMatrixTimesScalar = 143,
  kOpSelect = 169,
  kOpPhi = 245,
  kOpLoopMerge = 246,
  kOpSelectionMerge = 247,
  kOpSwitch = 251,
  kOpNoLine = 317,
  kOpModuleProcessed = 330,
  kOpExecutionModeId = 331,
  kOpTypeCoopKhr = 4456,
  kOpCoopLoadKhr = 4457,
  kOpCoopStoreKhr = 4458,
  kOpCoopMulAddKhr = 4459,
  kOpCoopLengthKhr = 4460,
  kOpTypeCoopNv = 5358,
  kOpCoopLoadNv = 5359,
  kOpCoopStoreNv = 5360,
  kOpCoopMulAddNv = 5361,
  kOpCoopLengthNv = 5362,
};
constexpr uint32_t kCapCoopNv = 5357, kCapCoopKhr = 6022;
constexpr uint32_t kMagic = 0x07230203;
constexpr char kExtNv[] = "SPV_NV_cooperative_matrix";
constexpr char kExtKhr[] = "SPV_KHR_cooperative_matrix";

// Matrix uses (CooperativeMatrixUse) and memory layouts (CooperativeMatrixLayout).
enum Use : int { kUseA = 0, kUseB = 1, kUseAcc = 2, kUses = 3 };
constexpr uint32_t kRowMajor = 0, kColMajor = 1;

struct Inst {
  uint32_t op;
  std::vector<uint32_t> w;  // operands (the words after the first)
};

uint32_t inst_op(uint32_t first) {
  return first & 0xffffu;
}
uint32_t inst_len(uint32_t first) {
  return first >> 16;
}

std::vector<uint32_t> string_words(const char* s) {
  const size_t n = std::strlen(s) + 1;
  std::vector<uint32_t> w((n + 3) / 4, 0);
  std::memcpy(w.data(), s, n);
  return w;
}

bool is_string(const std::vector<uint32_t>& w, const char* s) {
  const std::vector<uint32_t> want = string_words(s);
  return w == want;
}

struct UnionFind {
  std::unordered_map<uint32_t, uint32_t> parent;
  uint32_t find(uint32_t x) {
    auto it = parent.find(x);
    if (it == parent.end()) {
      parent.emplace(x, x);
      return x;
    }
    while (it->second != x) {
      const uint32_t p = it->second;
      auto pit = parent.find(p);
      it->second = pit->second;  // path halving
      x = p;
      it = parent.find(x);
    }
    return x;
  }
  void unite(uint32_t a, uint32_t b) {
    a = find(a);
    b = find(b);
    if (a != b) parent[a] = b;
  }
};

// Value instructions whose result takes the matrix operands' use (copies,
// conversions, arithmetic, composites).
bool passes_value_through(uint32_t op) {
  switch (op) {
    case kOpCopyObject:
    case kOpFConvert:
    case kOpFNegate:
    case kOpFAdd:
    case kOpFSub:
    case kOpFMul:
    case kOpFDiv:
    case kOpMatrixTimesScalar:
    case kOpCompositeConstruct:
    case kOpCompositeInsert:
    case kOpCompositeExtract: return true;
    default: return false;
  }
}

// Whether an instruction has a result type (operand 0) and a result
// (operand 1): the opcodes this rewrite follows values through. Any other
// instruction that names a matrix type or value makes the rewrite fail.
bool has_type_and_result(uint32_t op) {
  switch (op) {
    case kOpUndef:
    case kOpConstantTrue:
    case kOpConstantFalse:
    case kOpConstant:
    case kOpConstantComposite:
    case kOpConstantNull:
    case kOpFunction:
    case kOpFunctionParameter:
    case kOpFunctionCall:
    case kOpVariable:
    case kOpLoad:
    case kOpAccessChain:
    case kOpInBoundsAccessChain:
    case kOpSelect:
    case kOpPhi:
    case kOpCoopLoadNv:
    case kOpCoopMulAddNv:
    case kOpCoopLengthNv: return true;
    default: return false;
  }
}

// Instructions whose operands include literals that may equal an id by
// chance, and that cannot carry a matrix: not scanned for matrix ids.
bool has_literals_only(uint32_t op) {
  switch (op) {
    case kOpSource:
    case kOpSourceExtension:
    case kOpString:
    case kOpExtInstImport:
    case kOpMemoryModel:
    case kOpExecutionMode:
    case kOpExecutionModeId:
    case kOpCapability:
    case kOpExtension:
    case kOpTypeInt:
    case kOpTypeFloat:
    case kOpTypeVector:
    case kOpConstant:
    case kOpSpecConstant:
    case kOpLoopMerge:
    case kOpSelectionMerge:
    case kOpSwitch:
    case kOpModuleProcessed: return true;
    default: return false;
  }
}

class Rewriter {
 public:
  explicit Rewriter(std::span<const uint32_t> words) : in_(words) {}

  Result<std::vector<uint32_t>> run() {
    if (in_.size() < 5 || in_[0] != kMagic)
      return make_error(ErrorCode::kFormat, "SPIR-V: not a module (bad magic number)");
    bound_ = in_[3];
    for (size_t i = 5; i < in_.size();) {
      const uint32_t n = inst_len(in_[i]);
      if (n == 0 || i + n > in_.size())
        return make_error(ErrorCode::kFormat, "SPIR-V: instruction at word %zu runs past the end",
                          i);
      insts_.push_back(
          Inst{inst_op(in_[i]), std::vector<uint32_t>(in_.begin() + i + 1, in_.begin() + i + n)});
      i += n;
    }
    LOOM_TRY(scan_types());
    if (nv_types_.empty()) return std::vector<uint32_t>(in_.begin(), in_.end());
    LOOM_TRY(classify());
    return emit();
  }

 private:
  // ---- types ----------------------------------------------------------------
  // The family: NV matrix types, and arrays of and pointers to the family.
  Status scan_types() {
    for (const Inst& in : insts_) {
      switch (in.op) {
        case kOpTypeCoopNv: {
          nv_types_.insert(in.w[0]);
          family_.insert(in.w[0]);
          auto f = float_width_.find(in.w[1]);
          nv_default_[in.w[0]] = f != float_width_.end() && f->second == 32 ? kUseAcc : kUseA;
          break;
        }
        case kOpTypeArray:
        case kOpTypeRuntimeArray:
          if (family_.count(in.w[1])) family_.insert(in.w[0]), elem_[in.w[0]] = in.w[1];
          break;
        case kOpTypePointer:
          if (family_.count(in.w[2])) family_.insert(in.w[0]), elem_[in.w[0]] = in.w[2];
          break;
        case kOpTypeStruct:
          for (size_t k = 1; k < in.w.size(); ++k) {
            if (family_.count(in.w[k]))
              return make_error(ErrorCode::kUnsupported,
                                "SPIR-V: a struct (%%%u) holds a cooperative matrix", in.w[0]);
          }
          break;
        case kOpTypeFloat: float_width_[in.w[0]] = in.w[1]; break;
        case kOpTypeInt:
          if (in.w[1] == 32 && in.w[2] == 0 && !uint_type_) uint_type_ = in.w[0];
          break;
        case kOpConstantTrue:
        case kOpConstantFalse: bools_[in.w[1]] = in.op == kOpConstantTrue; break;
        default: break;
      }
      if (has_type_and_result(in.op) && in.w.size() >= 2) type_of_[in.w[1]] = in.w[0];
    }
    if (!uint_type_)
      return make_error(ErrorCode::kUnsupported, "SPIR-V: no 32-bit unsigned integer type");
    return Status::ok_status();
  }

  bool in_family(uint32_t type) const { return family_.count(type) != 0; }
  bool value_in_family(uint32_t id) const {
    auto it = type_of_.find(id);
    return it != type_of_.end() && in_family(it->second);
  }

  // The use a matrix of NV type t has where nothing decides (scan_types):
  // F32 accumulates, anything narrower is an A operand.
  Use default_use(uint32_t nv_type) const {
    auto it = nv_default_.find(nv_type);
    return it != nv_default_.end() ? it->second : kUseA;
  }

  // ---- classes ----------------------------------------------------------------
  Status classify() {
    for (const Inst& in : insts_) {
      const std::vector<uint32_t>& w = in.w;
      if (passes_value_through(in.op)) {
        if (in_family(w[0])) {
          // Matrix operands share the result's use; scalars (and the
          // literal indices of extract / insert) are left alone.
          const size_t last = in.op == kOpCompositeExtract  ? 3
                              : in.op == kOpCompositeInsert ? 4
                                                            : w.size();
          for (size_t k = 2; k < last && k < w.size(); ++k) {
            if (value_in_family(w[k])) uf_.unite(w[1], w[k]);
          }
        }
        continue;  // otherwise a scalar out of a matrix, or no matrix at all
      }
      switch (in.op) {
        case kOpTypeCoopNv:
        case kOpTypeArray:
        case kOpTypeRuntimeArray:
        case kOpTypePointer:
        case kOpName:
        case kOpMemberName:
        case kOpDecorate:
        case kOpMemberDecorate:
        case kOpEntryPoint:
        case kOpLine:
        case kOpNoLine:
        case kOpConstantComposite:
        case kOpConstantNull:
        case kOpUndef:
        case kOpVariable:
        case kOpCoopLoadNv:
        case kOpCoopLengthNv:
        case kOpCoopStoreNv:  // any use may be stored
          break;
        case kOpCoopMulAddNv:
          mark(w[2], kUseA);
          mark(w[3], kUseB);
          mark(w[4], kUseAcc);
          uf_.unite(w[1], w[4]);
          break;
        case kOpLoad:
          if (in_family(w[0])) uf_.unite(w[1], w[2]);
          break;
        case kOpStore:
          if (value_in_family(w[1])) uf_.unite(w[0], w[1]);
          break;
        case kOpAccessChain:
        case kOpInBoundsAccessChain:
          if (in_family(w[0])) uf_.unite(w[1], w[2]);
          break;
        case kOpPhi:
          if (in_family(w[0])) {
            for (size_t k = 2; k + 1 < w.size(); k += 2) uf_.unite(w[1], w[k]);
          }
          break;
        case kOpSelect:
          if (in_family(w[0])) uf_.unite(w[1], w[3]), uf_.unite(w[1], w[4]);
          break;
        case kOpFunctionParameter:
          if (in_family(w[0]))
            return make_error(ErrorCode::kUnsupported,
                              "SPIR-V: a function takes a cooperative matrix (%%%u); inline it",
                              w[1]);
          break;
        default:
          // Anything else that names a matrix type or value is not mapped
          // (its result would need a use the rewrite cannot tell).
          if (has_literals_only(in.op)) break;
          for (uint32_t x : w) {
            if (in_family(x) || value_in_family(x))
              return make_error(ErrorCode::kUnsupported,
                                "SPIR-V: opcode %u takes or makes a cooperative matrix; the "
                                "NV-to-KHR rewrite does not map it",
                                in.op);
          }
          break;
      }
    }
    // Each class's use: the one operand kind it reaches.
    for (const auto& [id, mask] : marks_) {
      const uint32_t root = uf_.find(id);
      class_mask_[root] |= mask;
    }
    for (const auto& [root, mask] : class_mask_) {
      if (mask & (mask - 1))
        return make_error(ErrorCode::kUnsupported,
                          "SPIR-V: one cooperative matrix (class of %%%u) is used as more than "
                          "one of A, B and the accumulator",
                          root);
    }
    return Status::ok_status();
  }

  void mark(uint32_t id, Use u) { marks_[id] |= 1u << u; }

  // The use of the value or variable `id` (whose type is in the family).
  Use use_of(uint32_t id, uint32_t type) {
    auto it = class_mask_.find(uf_.find(id));
    if (it != class_mask_.end() && it->second)
      return static_cast<Use>(std::countr_zero(it->second));
    return default_use(base_nv_type(type));
  }

  uint32_t base_nv_type(uint32_t type) const {
    while (!nv_types_.count(type)) type = elem_.at(type);
    return type;
  }

  // ---- output -----------------------------------------------------------------
  // The id of family type t for use u: t itself where u is its NV type's
  // default, else a clone (declared right after t's declaration).
  uint32_t type_for(uint32_t t, Use u) {
    if (u == default_use(base_nv_type(t))) return t;
    const uint64_t key = (uint64_t(t) << 2) | u;
    auto it = clones_.find(key);
    if (it != clones_.end()) return it->second;
    const uint32_t id = bound_++;
    clones_.emplace(key, id);
    return id;
  }

  uint32_t new_uint_constant(uint32_t value, std::vector<uint32_t>& out) {
    const uint32_t id = bound_++;
    put(out, kOpConstant, {uint_type_, id, value});
    return id;
  }

  static void put(std::vector<uint32_t>& out, uint32_t op, const std::vector<uint32_t>& w) {
    out.push_back(((static_cast<uint32_t>(w.size()) + 1) << 16) | op);
    out.insert(out.end(), w.begin(), w.end());
  }

  Result<uint32_t> layout_of(uint32_t bool_id) const {
    auto it = bools_.find(bool_id);
    if (it == bools_.end())
      return make_error(ErrorCode::kUnsupported,
                        "SPIR-V: a cooperative-matrix load or store's column-major operand "
                        "(%%%u) is not a constant",
                        bool_id);
    return it->second ? kColMajor : kRowMajor;
  }

  // Declarations of the clones of type t (and of what is built on it), in
  // dependency order, emitted right after t's own declaration.
  void emit_clones_of(const Inst& decl, std::vector<uint32_t>& out) {
    const uint32_t t = decl.w[0];
    for (int u = 0; u < kUses; ++u) {
      auto it = clones_.find((uint64_t(t) << 2) | static_cast<uint32_t>(u));
      if (it == clones_.end()) continue;
      std::vector<uint32_t> w = decl.w;
      w[0] = it->second;
      if (decl.op == kOpTypeCoopNv) {
        w.push_back(use_const_[u]);
        put(out, kOpTypeCoopKhr, w);
        continue;
      }
      const size_t elem_at = decl.op == kOpTypePointer ? 2 : 1;
      w[elem_at] = type_for(w[elem_at], static_cast<Use>(u));
      put(out, decl.op, w);
    }
  }

  Result<std::vector<uint32_t>> emit() {
    // First pass: which clones the retyped ids need (so emit_clones_of finds
    // them when their base type is declared), then the clones of the element
    // types that array and pointer clones are built on.
    for (const Inst& in : insts_) {
      if (!has_type_and_result(in.op) || in.w.size() < 2 || !in_family(in.w[0])) continue;
      if (in.op == kOpTypeArray || in.op == kOpTypeRuntimeArray || in.op == kOpTypePointer)
        continue;
      type_for(in.w[0], use_of(in.w[1], in.w[0]));
    }
    bool grew = true;
    while (grew) {
      grew = false;
      for (const auto& [key, id] : std::map<uint64_t, uint32_t>(clones_.begin(), clones_.end())) {
        const uint32_t t = static_cast<uint32_t>(key >> 2);
        const Use u = static_cast<Use>(key & 3);
        auto e = elem_.find(t);
        if (e != elem_.end() && !clones_.count((uint64_t(e->second) << 2) | u) &&
            u != default_use(base_nv_type(e->second))) {
          type_for(e->second, u);
          grew = true;
        }
      }
    }

    // A clone has no decorations of its own: refuse types that have some
    // (a function-local array of matrices has none).
    for (const Inst& d : insts_) {
      if ((d.op == kOpDecorate || d.op == kOpMemberDecorate) && !d.w.empty()) {
        for (const auto& [key, id] : clones_) {
          if (static_cast<uint32_t>(key >> 2) == d.w[0])
            return make_error(ErrorCode::kUnsupported,
                              "SPIR-V: type %%%u, split by use, has decorations", d.w[0]);
        }
      }
    }

    const uint32_t bound_planned = bound_ + kUses;  // the clones, then the use constants
    std::vector<uint32_t> out(in_.begin(), in_.begin() + 5);
    bool consts_done = false;
    for (size_t i = 0; i < insts_.size(); ++i) {
      const Inst& in = insts_[i];
      std::vector<uint32_t>& o = out;
      std::vector<uint32_t> w = in.w;
      switch (in.op) {
        case kOpCapability:
          if (w[0] == kCapCoopNv) w[0] = kCapCoopKhr;
          put(o, in.op, w);
          continue;
        case kOpExtension:
          put(o, in.op, is_string(w, kExtNv) ? string_words(kExtKhr) : w);
          continue;
        case kOpTypeCoopNv: {
          if (!consts_done) {
            for (int u = 0; u < kUses; ++u) use_const_[u] = new_uint_constant(u, o);
            consts_done = true;
          }
          w.push_back(use_const_[default_use(w[0])]);
          put(o, kOpTypeCoopKhr, w);
          emit_clones_of(in, o);
          continue;
        }
        case kOpTypeArray:
        case kOpTypeRuntimeArray:
        case kOpTypePointer:
          put(o, in.op, w);
          if (in_family(w[0])) emit_clones_of(in, o);
          continue;
        case kOpCoopLoadNv: {
          // NV: type, result, pointer, stride, column-major[, memory access...]
          // KHR: type, result, pointer, layout, stride[, memory operand...]
          LOOM_ASSIGN_OR_RETURN(const uint32_t layout, layout_of(w[4]));
          std::vector<uint32_t> k = {type_for(w[0], use_of(w[1], w[0])), w[1], w[2],
                                     use_const_[layout], w[3]};
          k.insert(k.end(), w.begin() + 5, w.end());
          put(o, kOpCoopLoadKhr, k);
          continue;
        }
        case kOpCoopStoreNv: {
          // NV: pointer, object, stride, column-major[, ...]; KHR: pointer, object, layout,
          // stride[, ...]
          LOOM_ASSIGN_OR_RETURN(const uint32_t layout, layout_of(w[3]));
          std::vector<uint32_t> k = {w[0], w[1], use_const_[layout], w[2]};
          k.insert(k.end(), w.begin() + 4, w.end());
          put(o, kOpCoopStoreKhr, k);
          continue;
        }
        case kOpCoopMulAddNv:
          w[0] = type_for(w[0], use_of(w[1], w[0]));
          put(o, kOpCoopMulAddKhr, w);
          continue;
        case kOpCoopLengthNv: put(o, kOpCoopLengthKhr, w); continue;
        default: break;
      }
      if (has_type_and_result(in.op) && w.size() >= 2 && in_family(w[0]) && in.op != kOpTypeArray &&
          in.op != kOpTypeRuntimeArray && in.op != kOpTypePointer)
        w[0] = type_for(w[0], use_of(w[1], w[0]));
      put(o, in.op, w);
    }
    if (bound_ != bound_planned)
      return make_error(ErrorCode::kInternal,
                        "SPIR-V: the NV-to-KHR rewrite needed a type it had not declared");
    out[3] = bound_;
    return out;
  }

  std::span<const uint32_t> in_;
  std::vector<Inst> insts_;
  uint32_t bound_ = 0;
  uint32_t uint_type_ = 0;
  std::unordered_set<uint32_t> nv_types_, family_;
  std::unordered_map<uint32_t, uint32_t> elem_;         // array / pointer -> element
  std::unordered_map<uint32_t, uint32_t> type_of_;      // result id -> result type
  std::unordered_map<uint32_t, uint32_t> float_width_;  // float type -> width
  std::unordered_map<uint32_t, Use> nv_default_;        // NV matrix type -> its own use
  std::unordered_map<uint32_t, bool> bools_;            // constant true / false
  std::unordered_map<uint32_t, uint32_t> marks_;        // MulAdd operand -> use bits
  std::unordered_map<uint32_t, uint32_t> class_mask_;   // class root -> use bits
  std::unordered_map<uint64_t, uint32_t> clones_;       // (type << 2 | use) -> clone id
  uint32_t use_const_[kUses] = {0, 0, 0};
  UnionFind uf_;
};

}  // namespace

bool spirv_uses_nv_coopmat(std::span<const uint32_t> words) {
  for (size_t i = 5; i < words.size();) {
    const uint32_t n = inst_len(words[i]);
    if (n == 0) return false;
    if (inst_op(words[i]) == kOpCapability && n == 2 && i + 1 < words.size() &&
        words[i + 1] == kCapCoopNv)
      return true;
    if (inst_op(words[i]) == kOpFunction) return false;  // capabilities come first
    i += n;
  }
  return false;
}

Result<std::vector<uint32_t>> spirv_nv_coopmat_to_khr(std::span<const uint32_t> words) {
  return Rewriter(words).run();
}

}  // namespace loom::vk
