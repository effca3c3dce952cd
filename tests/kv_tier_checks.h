// The device KV tier's checks, shared by the GPU backends' suites
// (kv_tier_checks.cpp says what each one asserts).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/model/model.h"
#include "engine/runtime/kv_cache.h"

namespace loom::test {

/// One (layer, block) of K+V of the session model (2 KV heads of 64, F16, 32 rows).
inline constexpr uint64_t kTierPair = 2ull * 32 * 2 * 64 * 2;

/// Normal random values (seeded).
std::vector<float> tier_randn(size_t n, uint32_t seed, float sd = 1.0f);
/// Largest |a - b| over the largest |b|.
double tier_rel_err(const std::vector<float>& a, const std::vector<float>& b);
/// A host cache holding `n` tokens of K/V ([layer 0][token][n_kv * hd]).
std::unique_ptr<KvCache> tier_host_cache(const KvCacheConfig& cfg, const std::vector<float>& k,
                                         const std::vector<float>& v, int64_t n);
/// cpu/ref attention of q [T, n_heads * hd] at positions pos over layer 0 of the cache.
std::vector<float> tier_ref_attention(const KvCache& kv, const std::vector<float>& q,
                                      const std::vector<int32_t>& pos, int64_t n_heads);
/// Bytes of one (layer, block) pair of 2 KV heads of 64 in `t`, 32 rows.
uint64_t tier_pair_bytes(DType t);

struct TierMix {
  const char* name;
  int64_t device_slots;  ///< per layer (0: no device tier)
  uint64_t ram_pairs;    ///< RAM budget in pairs (0: no limit)
};
inline constexpr TierMix kTierMixes[] = {
    {"device_only", 0, 0}, {"device_ram", 6, 0}, {"device_ram_ssd", 6, 3}};

/// A layer fed token by token (prefill chunks of 20, then single tokens) with
/// rebalancing between steps, then attention at the last positions: equal to
/// cpu/ref over all tokens whatever tier each block ended on; also after the
/// layer moved off the device and back. `slots_per_split` sets the backend's
/// slots per split of the decode kernel (0: its own plan).
void check_attention_across_tiers(Backend& be, DType t, const TierMix& mix,
                                  const std::function<void(uint32_t)>& slots_per_split);

/// A two-layer `loom synth` llama with F16 weights (no matvec reads a Q8
/// copy of its input), n_ctx 1024.
std::unique_ptr<Model> tier_test_model();
/// Greedy tokens after a 400-token prompt, with these tiers.
std::vector<int32_t> greedy(Model& model, Backend& be, const KvTierConfig& t, int n,
                            KvTierStats* ts, std::vector<KvLayerTiers>* layers = nullptr);
/// The same tokens as all on the device under each mix and both policies.
void check_greedy_identical_in_every_mix(Model& model, Backend& be);
/// A second conversation reuses the slots and host blocks the first left.
void check_second_conversation(Model& model, Backend& be);
/// Two conversations (420 tokens and 19 generated, then 150 and 20) fed to a
/// tiered session and an all-on-device one alike (the latter's greedy tokens):
/// at every step the logits are within 1e-3, and where the greedy token
/// differs the reference's top two logits are within that difference (a
/// rounding tie). Five variants (policies, token-wise prompt, chunk 16); each
/// prints its largest difference, and the device KV rows by block.
void diagnose_second_conversation(Model& model, Backend& be);
/// The same two conversations on the all-on-device session first (kept, or
/// destroyed before the next is made), then on a tiered one fed its tokens,
/// and the tiered one first: prints the steps whose logits differ by more
/// than 1e-3, and expects none.
void diagnose_second_conversation_in_turn(Model& model, Backend& be);
/// Blocks lost on the SSD (an I/O error, a short read) are recomputed.
void check_lost_blocks_recomputed(Model& model, Backend& be);
/// A budget too small for the sinks, the window and a step names --kv-gpu.
void check_too_small_device_budget(Model& model, Backend& be);

}  // namespace loom::test
