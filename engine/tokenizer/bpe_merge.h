// The BPE merge step, shared by byte-level BPE (symbols start as bytes) and
// SentencePiece-style BPE read from tokenizer.json (symbols start as UTF-8
// characters, merges by rank rather than by score). Internal to tokenizer/.
#pragma once

#include <cstdint>
#include <queue>
#include <vector>

#include "engine/tokenizer/vocab.h"

namespace loom {

/// Merges adjacent symbols by merge rank, lowest rank first, leftmost on ties.
/// Symbols only grow to the right, so a queued pair is still current exactly
/// when both symbols are alive, adjacent, and have the ids they had when it
/// was queued. Reusable across words; not thread-safe (one per encode call).
class BpeMerger {
 public:
  explicit BpeMerger(const Vocab& vocab);

  /// `ids`: the initial symbols' token ids (-1: not a token, never merges).
  /// On return `ids` holds the surviving symbols in order, and `counts` (when
  /// not null) how many initial symbols each one covers.
  void merge(std::vector<int32_t>* ids, std::vector<uint32_t>* counts);

 private:
  struct Symbol {
    int32_t id;
    uint32_t count;  ///< initial symbols covered
    int64_t prev;
    int64_t next;
    bool alive;
  };
  struct Pair {
    int32_t rank;
    int64_t left;
    int64_t right;
    int32_t left_id;
    int32_t right_id;
  };
  struct LaterFirst {
    // priority_queue pops the largest: make that the lowest rank, then the leftmost.
    bool operator()(const Pair& a, const Pair& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
  };
  using Queue = std::priority_queue<Pair, std::vector<Pair>, LaterFirst>;

  void try_add(int64_t left, int64_t right);

  const Vocab& vocab_;
  std::vector<Symbol> symbols_;
  Queue queue_;
};

}  // namespace loom
