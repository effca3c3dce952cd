// What `loom perplexity` and `loom kl` share: the evaluation text, read and
// tokenized (no BOS: each window gets its own, see engine/runtime/quality.h).
#pragma once

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/model.h"

namespace loom::cli {

/// The tokens of the text file `path`, or an empty vector after printing why (prefixed by `who`).
inline std::vector<int32_t> read_eval_tokens(const std::string& path, const Model& m,
                                             const char* who) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "%s: cannot open the text file '%s'\n", who, path.c_str());
    return {};
  }
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  if (text.empty()) {
    std::fprintf(stderr, "%s: the text file '%s' is empty\n", who, path.c_str());
    return {};
  }
  return m.tokenizer->encode(text, /*add_special=*/false, /*parse_special=*/false);
}

}  // namespace loom::cli
