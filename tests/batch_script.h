// The continuous-batching script of the batch tests (tests/unit/
// batch_eval_test.cpp, tests/cuda/backend_batch_test.cpp): three sequences
// stepped through prompt chunks of odd sizes and decode steps, batched in one
// forward pass or each alone in its own, and the comparison of their logits.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/runtime/session.h"
#include "tests/test_util.h"

namespace loom::test {

inline std::unique_ptr<Model> synth_batch_model(const std::string& arch, const std::string& dtype) {
  SynthSpec s;
  s.arch = arch;
  s.n_layer = 3;
  s.n_embd = 128;
  s.n_ff = 320;
  s.n_head = 4;
  s.n_head_kv = arch == "phi3" ? 4 : 2;
  s.n_ctx = 128;
  s.weight_type = dtype;
  s.seed = 11;
  return synth_model(s, "batch_" + arch + "_" + dtype);
}

// Three sequences over a few steps: which tokens of each go in a step, and
// whether it wants logits. Prompt chunks of 5/4/6 rows, then 4 + a decode
// token + 7 (the rows wanting logits sit before and between others), then
// decode steps of all three.
struct Part {
  int seq;
  int64_t from, n;  ///< tokens [from, from + n) of the sequence's stream
  bool logits;
};
inline std::vector<std::vector<Part>> script() {
  std::vector<std::vector<Part>> steps = {
      {{0, 0, 5, false}, {1, 0, 4, true}, {2, 0, 6, false}},
      {{0, 5, 4, true}, {1, 4, 1, true}, {2, 6, 7, true}},
  };
  int64_t pos[3] = {9, 5, 13};
  for (int s = 0; s < 6; ++s) {
    std::vector<Part> step;
    for (int q = 0; q < 3; ++q) step.push_back({q, pos[q]++, 1, true});
    if (s == 3) std::swap(step[0], step[2]);  // another order
    steps.push_back(step);
  }
  return steps;
}

// The tokens of sequence q (prompt and forced "generated" ones alike).
inline std::vector<int32_t> stream(int q, int64_t n_vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < 32; ++i) t.push_back(static_cast<int32_t>((q * 97 + i * 31 + 1) % n_vocab));
  return t;
}

using Logits = std::vector<std::vector<float>>;  // per (step, part) that wants them

// The script batched in one shared pass (`batched`) or each sequence alone in
// its own pass; `setup` readies a pass (placement) before use.
inline Logits run(const Model& m, Backend& be, DType kv_dtype, bool batched,
                  const std::function<void(ForwardPass&)>& setup) {
  SessionConfig sc;
  sc.n_ctx = 64;
  sc.kv_dtype = kv_dtype;
  std::vector<std::unique_ptr<Session>> ss;
  for (int q = 0; q < 3; ++q) {
    auto s = q > 0 && batched ? Session::create_sharing(*ss[0], sc) : Session::create(m, be, sc);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok()) return {};
    if (q == 0 || !batched) setup((*s)->forward());
    ss.push_back(std::move(s).value());
  }
  const int64_t V = m.hp.n_vocab;
  std::vector<std::vector<int32_t>> toks;
  for (int q = 0; q < 3; ++q) toks.push_back(stream(q, V));
  Logits out;
  for (const auto& step : script()) {
    std::vector<std::vector<float>> lg(step.size(), std::vector<float>(static_cast<size_t>(V)));
    std::vector<Session::BatchItem> items;
    for (size_t i = 0; i < step.size(); ++i) {
      const Part& p = step[i];
      Session::BatchItem it;
      it.session = ss[static_cast<size_t>(p.seq)].get();
      it.tokens = std::span<const int32_t>(toks[static_cast<size_t>(p.seq)].data() + p.from,
                                           static_cast<size_t>(p.n));
      it.logits = p.logits ? lg[i].data() : nullptr;
      items.push_back(it);
    }
    if (batched) {
      Session::append_batch(items);
      for (const auto& it : items) EXPECT_TRUE(it.status.ok()) << it.status.message();
    } else {
      for (auto& it : items) {
        const Status st = it.session->append(it.tokens, it.logits);
        EXPECT_TRUE(st.ok()) << st.message();
      }
    }
    for (size_t i = 0; i < step.size(); ++i)
      if (step[i].logits) out.push_back(std::move(lg[i]));
  }
  for (int q = 0; q < 3; ++q) {
    int64_t n = 0;
    for (const auto& step : script())
      for (const Part& p : step)
        if (p.seq == q) n += p.n;
    EXPECT_EQ(ss[static_cast<size_t>(q)]->kv().n_tokens(), n);
  }
  return out;
}

// max |a - b| / max |b| over all logits; and (argmax) whether every argmax agrees.
inline void expect_close(const Logits& a, const Logits& b, double tol, const std::string& what,
                         bool argmax = true) {
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_FALSE(a.empty()) << what;
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < a[i].size(); ++j) {
      err = std::max(err, static_cast<double>(std::fabs(a[i][j] - b[i][j])));
      scale = std::max(scale, static_cast<double>(std::fabs(b[i][j])));
    }
    const auto am = std::max_element(a[i].begin(), a[i].end()) - a[i].begin();
    const auto bm = std::max_element(b[i].begin(), b[i].end()) - b[i].begin();
    if (argmax) {
      EXPECT_EQ(am, bm) << what << ": logits row " << i;
    }
  }
  EXPECT_LE(err / scale, tol) << what;
}

}  // namespace loom::test
