// The built-in tokenizer of synthetic models: a GPT-2-style byte-level BPE
// vocabulary learnt at run time from a short built-in text, so every model
// `loom synth` writes can tokenize and detokenize real text.
#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/synth.h"

namespace loom {
namespace {

// Training text for the merges: plain English, written for Loom.
constexpr const char* kCorpus =
    "Once upon a time there was a little robot who lived in a workshop by the sea. "
    "Every morning the robot opened the window, looked at the water and said hello to "
    "the birds. The birds did not answer, but they sang, and the robot was happy. "
    "One day a girl came into the workshop. She had a broken kite and a question. "
    "\"Can you fix it?\" she asked. The robot looked at the kite for a long time. "
    "Then it took some string, some paper and a little glue, and it worked until the "
    "sun went down. When the kite was ready, the girl and the robot went outside and "
    "let it fly over the sea. The wind was strong and the kite went higher and higher. "
    "The girl laughed and the robot laughed with her, in its own quiet way. "
    "After that day the girl came back often. She told the robot about her school, her "
    "friends and the books she read, and the robot told her about numbers, about the "
    "stars and about the tides. They were good friends for many years.\n"
    "The model answers questions, writes code and explains things step by step. "
    "It is running on your own computer, so what you write stays with you. "
    "def main():\n    print(\"hello, world\")\n    return 0\n"
    "for i in range(10):\n    total = total + i\n";

// GPT-2's reversible byte -> printable code point map.
std::string byte_symbol(int b) {
  int cp;
  bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  if (printable) {
    cp = b;
  } else {
    int k = 0;  // rank of b among the non-printable bytes
    for (int c = 0; c < b; ++c) {
      bool p = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
      if (!p) ++k;
    }
    cp = 256 + k;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Splits into words the way a GPT-2 pre-tokenizer roughly does (a letter or
// digit run keeps its leading space; anything else stands alone), as symbols.
std::vector<std::vector<std::string>> corpus_words() {
  std::vector<std::vector<std::string>> words;
  const std::string text = kCorpus;
  auto alnum = [&](size_t k) {
    return k < text.size() && std::isalnum(static_cast<unsigned char>(text[k]));
  };
  for (size_t i = 0; i < text.size();) {
    size_t j = i;
    if (text[j] == ' ' && alnum(j + 1)) ++j;
    if (alnum(j)) {
      while (alnum(j)) ++j;
    } else {
      ++j;
    }
    std::vector<std::string> w;
    for (size_t k = i; k < j; ++k) w.push_back(byte_symbol(static_cast<unsigned char>(text[k])));
    words.push_back(std::move(w));
    i = j;
  }
  return words;
}

}  // namespace

SynthVocab builtin_synth_vocab(int64_t n_vocab) {
  SynthVocab v;
  auto add = [&](std::string t, int32_t type) {
    v.tokens.push_back(std::move(t));
    v.token_types.push_back(type);
  };
  // Token types as GGUF stores them: 1 normal, 3 control, 5 unused.
  add("<s>", 3);
  add("</s>", 3);
  add("<|im_start|>", 3);
  add("<|im_end|>", 3);
  for (int b = 0; b < 256; ++b) add(byte_symbol(b), 1);

  // Byte-pair training: repeatedly merge the most frequent adjacent pair
  // (ties broken by the pair's text, so the result is deterministic).
  auto words = corpus_words();
  const int64_t base = static_cast<int64_t>(v.tokens.size());
  const int64_t max_merges = n_vocab > 0 ? std::max<int64_t>(0, n_vocab - base) : 2000;
  for (int64_t m = 0; m < max_merges; ++m) {
    std::map<std::pair<std::string, std::string>, int> counts;
    for (const auto& w : words) {
      for (size_t i = 0; i + 1 < w.size(); ++i) ++counts[{w[i], w[i + 1]}];
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int best_n = 1;  // a pair seen once is not worth a token
    for (const auto& [pair, n] : counts) {
      if (n > best_n) {
        best_n = n;
        best = &pair;
      }
    }
    if (!best) break;
    const std::string a = best->first, b = best->second;
    v.merges.push_back(a + " " + b);
    add(a + b, 1);
    for (auto& w : words) {
      std::vector<std::string> out;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
          out.push_back(a + b);
          ++i;
        } else {
          out.push_back(w[i]);
        }
      }
      w.swap(out);
    }
  }
  for (int64_t i = static_cast<int64_t>(v.tokens.size()); i < n_vocab; ++i) {
    add("<unused" + std::to_string(i) + ">", 5);
  }
  return v;
}

}  // namespace loom
