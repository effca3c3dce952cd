// `loom tokenize -m FILE -p TEXT`: the token ids of a text, as the model's tokenizer makes them
// (FILE: a GGUF, a tokenizer.json or a Hugging Face folder).
#include <cstdio>
#include <string>

#include "engine/model/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/vocab.h"
#include "tools/loom/commands.h"

namespace loom::cli {
namespace {

// A piece shown between quotes: control characters and bytes that are not
// valid UTF-8 on their own are escaped so the terminal shows what is there.
std::string printable_piece(const std::string& piece) {
  std::string out;
  for (size_t i = 0; i < piece.size(); ++i) {
    const auto c = static_cast<unsigned char>(piece[i]);
    char buf[8];
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\\' || c == '\'') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      // Copy a whole well-formed multi-byte character, escape anything else.
      size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
      bool ok = n > 0 && c <= 0xF4 && i + n <= piece.size();
      for (size_t k = 1; ok && k < n; ++k) {
        ok = (static_cast<unsigned char>(piece[i + k]) & 0xC0) == 0x80;
      }
      if (ok) {
        out.append(piece, i, n);
        i += n - 1;
      } else {
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        out += buf;
      }
    }
  }
  return out;
}

}  // namespace

int cmd_tokenize(const TokenizeOptions& o) {
  // A GGUF file, a tokenizer.json, or a Hugging Face folder.
  auto src = load_tokenizer_source(o.model);
  if (!src.ok()) {
    std::fprintf(stderr, "loom tokenize: %s\n", src.message().c_str());
    return 1;
  }
  for (const std::string& n : src->notes)
    std::fprintf(stderr, "loom tokenize: note: %s\n", n.c_str());
  auto tokenizer = Tokenizer::create(std::move(src->vocab));
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "loom tokenize: %s: %s\n", o.model.c_str(), tokenizer.message().c_str());
    return 1;
  }
  if (!tokenizer->warning().empty()) {
    std::fprintf(stderr, "loom tokenize: warning: %s\n", tokenizer->warning().c_str());
  }

  // add_special adds BOS only where the vocabulary asks for it (and EOS likewise).
  const std::vector<int32_t> ids = tokenizer->encode(o.prompt, !o.no_bos, o.parse_special);
  if (o.pieces) {
    for (int32_t id : ids) {
      std::printf("%d '%s'\n", id, printable_piece(tokenizer->token_to_piece(id, true)).c_str());
    }
  } else {
    for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
    std::printf("\n");
  }
  return 0;
}

}  // namespace loom::cli
