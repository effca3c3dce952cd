// Byte-level BPE (GPT-2, Llama 3, Qwen2, DeepSeek, ...): pre-tokenize with the
// model's expressions, write each byte as its GPT-2 code point, then merge
// adjacent symbols by merge rank, lowest first.
#include <array>
#include <queue>

#include "engine/tokenizer/bpe_merge.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/pretokenize.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace loom {

namespace {

struct ByteLevelTables {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 512> to_byte{};  // every mapped code point is < 0x144
};

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables = [] {
    ByteLevelTables t;
    t.to_byte.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      // Printable ASCII and Latin-1 except the soft hyphen keep their value.
      const bool keeps = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t.to_cp[b] = keeps ? b : next++;
      t.to_byte[t.to_cp[b]] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

}  // namespace

uint32_t byte_level_encode(uint8_t b) {
  return byte_level_tables().to_cp[b];
}

int byte_level_decode(uint32_t cp) {
  return cp < 512 ? byte_level_tables().to_byte[cp] : -1;
}

void byte_level_decode_text(std::string_view text, std::string* out) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t n = utf8_char_length(text, pos);
    const auto b0 = static_cast<uint8_t>(text[pos]);
    int byte = -1;
    if (n == 1 && b0 < 0x80) {
      byte = byte_level_decode(b0);
    } else if (n == 2) {  // every mapped code point is below U+0800
      const auto b1 = static_cast<uint8_t>(text[pos + 1]);
      byte = byte_level_decode(((b0 & 0x1Fu) << 6) | (b1 & 0x3Fu));
    }
    if (byte >= 0) {
      out->push_back(static_cast<char>(byte));
    } else {
      out->append(text.substr(pos, n));
    }
    pos += n;
  }
}

BpeMerger::BpeMerger(const Vocab& vocab) : vocab_(vocab) {}

void BpeMerger::merge(std::vector<int32_t>* ids, std::vector<uint32_t>* counts) {
  symbols_.clear();
  queue_ = Queue();
  const auto n = static_cast<int64_t>(ids->size());
  symbols_.reserve(ids->size());
  for (int64_t i = 0; i < n; ++i) {
    symbols_.push_back({(*ids)[static_cast<size_t>(i)], 1, i - 1, i + 1 < n ? i + 1 : -1, true});
  }
  for (int64_t i = 1; i < n; ++i) try_add(i - 1, i);
  while (!queue_.empty()) {
    const Pair p = queue_.top();
    queue_.pop();
    Symbol& left = symbols_[static_cast<size_t>(p.left)];
    Symbol& right = symbols_[static_cast<size_t>(p.right)];
    if (!left.alive || !right.alive || left.next != p.right || left.id != p.left_id ||
        right.id != p.right_id) {
      continue;  // stale: one side was merged since
    }
    left.id = vocab_.merge(p.rank).result;
    left.count += right.count;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols_[static_cast<size_t>(right.next)].prev = p.left;
    try_add(left.prev, p.left);
    try_add(p.left, left.next);
  }
  ids->clear();
  if (counts) counts->clear();
  for (const Symbol& s : symbols_) {
    if (!s.alive) continue;
    ids->push_back(s.id);
    if (counts) counts->push_back(s.count);
  }
}

void BpeMerger::try_add(int64_t left, int64_t right) {
  if (left < 0 || right < 0) return;
  const int32_t left_id = symbols_[static_cast<size_t>(left)].id;
  const int32_t right_id = symbols_[static_cast<size_t>(right)].id;
  if (left_id < 0 || right_id < 0) return;
  const int32_t rank = vocab_.merge_rank(left_id, right_id);
  if (rank < 0) return;
  queue_.push({rank, left, right, left_id, right_id});
}

void Tokenizer::encode_bpe(std::string_view text, std::vector<int32_t>* out) const {
  std::vector<std::string_view> words;
  pre_->split(text, &words);
  BpeMerger merger(vocab_);
  std::string mapped;
  std::vector<int32_t> ids;
  for (std::string_view word : words) {
    if (pre_->ignore_merges()) {
      // Llama 3: a word that is a token as a whole is that token, whatever the merges say.
      mapped.clear();
      for (char c : word) append_utf8(&mapped, byte_level_encode(static_cast<uint8_t>(c)));
      const int32_t id = vocab_.find(mapped);
      if (id >= 0) {
        out->push_back(id);
        continue;
      }
    }
    // One symbol per byte, as its GPT-2 character's token.
    ids.clear();
    for (char c : word) ids.push_back(byte_chars_[static_cast<uint8_t>(c)]);
    merger.merge(&ids, nullptr);
    for (int32_t id : ids) {
      if (id >= 0) {
        out->push_back(id);
      } else if (vocab_.special().unk >= 0) {
        // A byte whose character is not in the vocabulary (not a real GPT-2 style vocab).
        out->push_back(vocab_.special().unk);
      }
    }
  }
}

}  // namespace loom
