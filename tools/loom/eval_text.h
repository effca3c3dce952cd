// What `loom perplexity` and `loom kl` share: the evaluation text, read and
// tokenized (no BOS: each window gets its own, see engine/runtime/quality.h),
// and the windows over it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/runtime/quality.h"

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

/// The evaluation text's tokens and the windows laid over them.
struct EvalText {
  std::vector<int32_t> tokens;
  WindowOptions windows;  ///< n_ctx tokens a window, stride apart, at most max_windows
  int64_t n_windows = 0;  ///< how many windows fit in the tokens (at least 1)
};

/// Reads and tokenizes the text file `path` and counts its windows of `n_ctx`
/// tokens, `stride` apart (0: n_ctx), at most `max_windows` (0: all);
/// std::nullopt after printing why (prefixed by `who`).
inline std::optional<EvalText> read_eval_text(const std::string& path, const Model& m,
                                              int64_t n_ctx, int64_t stride, int64_t max_windows,
                                              const char* who) {
  EvalText t;
  t.tokens = read_eval_tokens(path, m, who);
  if (t.tokens.empty()) return std::nullopt;
  t.windows.n_ctx = n_ctx;
  t.windows.stride = stride;
  t.windows.max_windows = max_windows;
  auto n = count_windows(static_cast<int64_t>(t.tokens.size()), t.windows);
  if (!n.ok()) {
    std::fprintf(stderr, "%s: %s\n", who, n.message().c_str());
    return std::nullopt;
  }
  t.n_windows = *n;
  return t;
}

}  // namespace loom::cli
