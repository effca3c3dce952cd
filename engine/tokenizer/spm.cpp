// SentencePiece BPE ("llama" vocabularies): start from UTF-8 characters and
// repeatedly merge the adjacent pair whose concatenation is the token with the
// highest score; what is left over and not a token becomes byte tokens.
#include <queue>

#include "engine/tokenizer/bpe_merge.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace loom {

namespace {

class SpmEncoder {
 public:
  SpmEncoder(const Vocab& vocab, std::string_view text) : vocab_(vocab), text_(text) {}

  void encode(const std::array<int32_t, 256>& byte_tokens, std::vector<int32_t>* out) {
    for (size_t pos = 0; pos < text_.size();) {
      // Invalid UTF-8 is split byte by byte, so that it cannot swallow the
      // bytes of a following character (such as an escaped space).
      const size_t n = utf8_char_length(text_, pos);
      const auto index = static_cast<int64_t>(symbols_.size());
      symbols_.push_back({pos, n, index - 1, pos + n < text_.size() ? index + 1 : -1});
      pos += n;
    }
    for (int64_t i = 1; i < static_cast<int64_t>(symbols_.size()); ++i) try_add(i - 1, i);

    while (!queue_.empty()) {
      const Pair p = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[static_cast<size_t>(p.left)];
      Symbol& right = symbols_[static_cast<size_t>(p.right)];
      // Symbols only grow, so a pair is stale exactly when its total length changed.
      if (left.len == 0 || right.len == 0 || left.len + right.len != p.len) continue;
      left.len += right.len;
      right.len = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[static_cast<size_t>(right.next)].prev = p.left;
      try_add(left.prev, p.left);
      try_add(p.left, left.next);
    }

    for (int64_t i = symbols_.empty() ? -1 : 0; i != -1;
         i = symbols_[static_cast<size_t>(i)].next) {
      const Symbol& s = symbols_[static_cast<size_t>(i)];
      const std::string_view piece = text_.substr(s.start, s.len);
      const int32_t id = vocab_.find(piece);
      if (id >= 0) {
        out->push_back(id);
        continue;
      }
      // Byte fallback: a character the vocabulary lacks becomes its UTF-8 bytes.
      for (char c : piece) {
        const int32_t byte_id = byte_tokens[static_cast<uint8_t>(c)];
        if (byte_id >= 0) {
          out->push_back(byte_id);
        } else if (vocab_.special().unk >= 0) {
          out->push_back(vocab_.special().unk);
          break;  // one unk for the whole character
        }
      }
    }
  }

 private:
  struct Symbol {
    size_t start;
    size_t len;  ///< 0 once merged into its left neighbour
    int64_t prev;
    int64_t next;
  };
  struct Pair {
    float score;
    int64_t left;
    int64_t right;
    size_t len;
  };
  struct LaterFirst {
    // priority_queue pops the largest: make that the highest score, then the leftmost.
    bool operator()(const Pair& a, const Pair& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };

  void try_add(int64_t left, int64_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols_[static_cast<size_t>(left)];
    const Symbol& r = symbols_[static_cast<size_t>(right)];
    const size_t len = l.len + r.len;
    const int32_t id = vocab_.find(text_.substr(l.start, len));
    if (id < 0) return;
    queue_.push({vocab_.score(id), left, right, len});
  }

  const Vocab& vocab_;
  std::string_view text_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Pair, std::vector<Pair>, LaterFirst> queue_;
};

}  // namespace

void Tokenizer::encode_spm(std::string_view text, std::vector<int32_t>* out) const {
  if (vocab_.n_merges() == 0) {
    SpmEncoder(vocab_, text).encode(byte_tokens_, out);
    return;
  }
  // SentencePiece-style BPE from a tokenizer.json (Phi-3, Llama 2, Mistral):
  // the same symbols (UTF-8 characters), but merged by the file's merge ranks,
  // as Hugging Face's BPE model does; characters that are no token fall back
  // to their bytes. With Metaspace's split, each word ("▁" and what follows
  // up to the next "▁") is merged on its own.
  if (vocab_.spm_split_words()) {
    const std::string_view space = "\xE2\x96\x81";  // U+2581
    size_t word = 0;
    for (size_t at = text.find(space, 1); at != std::string_view::npos;
         at = text.find(space, at + space.size())) {
      if (at > word) encode_spm_merged(text.substr(word, at - word), out);
      word = at;
    }
    if (word < text.size()) encode_spm_merged(text.substr(word), out);
    return;
  }
  encode_spm_merged(text, out);
}

void Tokenizer::encode_spm_merged(std::string_view text, std::vector<int32_t>* out) const {
  std::vector<size_t> starts;
  std::vector<int32_t> ids;
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = utf8_char_length(text, pos);
    starts.push_back(pos);
    ids.push_back(vocab_.find(text.substr(pos, n)));
    pos += n;
  }
  starts.push_back(text.size());
  std::vector<uint32_t> counts;
  BpeMerger(vocab_).merge(&ids, &counts);
  size_t first = 0;  // index of the symbol's first character
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= 0) {
      out->push_back(ids[i]);
    } else {
      const std::string_view ch = text.substr(starts[first], starts[first + 1] - starts[first]);
      for (char c : ch) {
        const int32_t byte_id = byte_tokens_[static_cast<uint8_t>(c)];
        if (byte_id >= 0) {
          out->push_back(byte_id);
        } else if (vocab_.special().unk >= 0) {
          out->push_back(vocab_.special().unk);
          break;  // one unk for the whole character
        }
      }
    }
    first += counts[i];
  }
}

}  // namespace loom
