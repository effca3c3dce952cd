// Each Backend op of the CUDA backend against the CPU backend on odd shapes:
// get_rows and matmul (with bias, matmul_add, matmul_glu) for every dtype,
// rms_norm, rope (normal, NeoX, partial rotation, frequency factors, YaRN),
// kv_store + attention through a KvCache (F16 and Q8_0), silu_mul and add;
// and the errors: ids out of range, a memory limit, a failure reported by
// the next synchronize. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cpu/ref/quants.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/runtime/kv_cache.h"
#include "tests/cuda/backend_test_util.h"

namespace loom {
namespace {

using test::DevAct;

// A weight in host memory (a test's own "mapped file").
struct HostWeight {
  std::vector<uint8_t> bytes;
  Weight w;
  HostWeight(DType dt, int64_t n_out, int64_t n_in, uint64_t seed, float scale = 1.0f) {
    const uint64_t rb = *dtype_row_bytes(dt, static_cast<uint64_t>(n_in));
    bytes.resize(rb * static_cast<uint64_t>(n_out));
    const auto src = test::random_floats(static_cast<size_t>(n_out * n_in), seed, scale);
    for (int64_t r = 0; r < n_out; ++r)
      EXPECT_TRUE(ref::quantize_row(dt, src.data() + r * n_in, bytes.data() + rb * r, n_in).ok());
    w.data = bytes.data();
    w.dtype = dt;
    w.n_in = n_in;
    w.n_out = n_out;
    w.row_bytes = rb;
  }
};

Act host_act(std::vector<float>& v, int64_t rows, int64_t cols) {
  Act a;
  a.data = v.data();
  a.rows = rows;
  a.cols = cols;
  return a;
}

const DType kDtypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,
                         DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                         DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

int64_t row_len(DType d) {
  const uint32_t bs = traits(d).block_size;
  return bs == 256 ? 768 : (bs == 32 ? 416 : 297);
}

TEST(CudaBackendOps, GetRowsEqualsCpu) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  CpuBackend cpu(2);
  for (DType dt : kDtypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const int64_t n = row_len(dt);
    HostWeight hw(dt, 37, n, 3);
    const std::vector<int32_t> ids = {36, 0, 5, 5, 17};
    const int64_t T = static_cast<int64_t>(ids.size());
    std::vector<float> want(static_cast<size_t>(T * n));
    cpu.get_rows(hw.w, ids.data(), host_act(want, T, n));
    DevAct out(*be, T, n);
    be->get_rows(hw.w, ids.data(), out.act);
    EXPECT_LT(test::rel_error_f(out.get(*be), want), 1e-6);
  }
}

TEST(CudaBackendOps, MatmulEqualsCpu) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  CpuBackend cpu(2);
  for (DType dt : kDtypes) {
    const int64_t n_in = row_len(dt), n_out = 131;
    HostWeight hw(dt, n_out, n_in, 9);
    HostWeight bias(DType::kF32, 1, n_out, 10);
    bias.w.n_in = n_out;
    for (const int64_t T : {1, 4, 8, 9, 40}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " T " + std::to_string(T));
      auto x = test::random_floats(static_cast<size_t>(T * n_in), 20 + T);
      const bool quant = traits(dt).block_size > 1;
      // The CPU quantizes activations to Q8 (quantized weights) or rounds them
      // to the weight's F16/BF16; CUDA to Q8 at decode and to F16 for GEMMs.
      const double tol = quant                         ? 3e-2
                         : dt == DType::kBF16          ? 1e-2
                         : dt == DType::kF32 && T <= 8 ? 1e-5
                                                       : 5e-3;
      std::vector<float> want(static_cast<size_t>(T * n_out));
      cpu.matmul(hw.w, host_act(x, T, n_in), host_act(want, T, n_out), &bias.w);
      DevAct xd(*be, T, n_in, &x), out(*be, T, n_out);
      be->matmul(hw.w, xd.act, out.act, &bias.w);
      EXPECT_LT(test::rel_error_f(out.get(*be), want), tol);
      // matmul_add: y += W x.
      auto y0 = test::random_floats(static_cast<size_t>(T * n_out), 30 + T);
      std::vector<float> want_add = y0, tmp(want_add.size());
      cpu.matmul_add(hw.w, host_act(x, T, n_in), host_act(want_add, T, n_out),
                     host_act(tmp, T, n_out));
      DevAct yd(*be, T, n_out, &y0), td(*be, T, n_out);
      be->matmul_add(hw.w, xd.act, yd.act, td.act);
      EXPECT_LT(test::rel_error_f(yd.get(*be), want_add), tol);
    }
  }
}

TEST(CudaBackendOps, MatmulGluEqualsCpu) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  CpuBackend cpu(2);
  for (DType dt : {DType::kF16, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    const int64_t n_in = row_len(dt), n_out = 77;
    HostWeight g(dt, n_out, n_in, 40), u(dt, n_out, n_in, 41);
    for (const int64_t T : {1, 3, 12}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " T " + std::to_string(T));
      auto x = test::random_floats(static_cast<size_t>(T * n_in), 50 + T);
      std::vector<float> want(static_cast<size_t>(T * n_out)), tmp(want.size());
      cpu.matmul_glu(g.w, u.w, host_act(x, T, n_in), host_act(want, T, n_out),
                     host_act(tmp, T, n_out));
      DevAct xd(*be, T, n_in, &x), out(*be, T, n_out), td(*be, T, n_out);
      be->matmul_glu(g.w, u.w, xd.act, out.act, td.act);
      EXPECT_LT(test::rel_error_f(out.get(*be), want), dt == DType::kF16 ? 5e-3 : 4e-2);
    }
  }
}

TEST(CudaBackendOps, MatmulQkvEqualsCpu) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  CpuBackend cpu(2);
  const int64_t n_in = 512, nq = 128, nkv = 64;
  HostWeight wq(DType::kQ4_K, nq, n_in, 1), wk(DType::kQ4_K, nkv, n_in, 2),
      wv(DType::kQ6_K, nkv, n_in, 3);
  HostWeight bq(DType::kF32, 1, nq, 4), bk(DType::kF32, 1, nkv, 5), bv(DType::kF32, 1, nkv, 6);
  bq.w.n_in = nq;
  bk.w.n_in = nkv;
  bv.w.n_in = nkv;
  for (const bool with_bias : {false, true}) {
    for (const int64_t T : {1, 6, 20}) {
      SCOPED_TRACE(std::string(with_bias ? "biases" : "no biases") + " T " + std::to_string(T));
      const Weight none;
      const Weight& b0 = with_bias ? bq.w : none;
      const Weight& b1 = with_bias ? bk.w : none;
      const Weight& b2 = with_bias ? bv.w : none;
      auto x = test::random_floats(static_cast<size_t>(T * n_in), 7 + T);
      std::vector<float> q(static_cast<size_t>(T * nq)), k(static_cast<size_t>(T * nkv)),
          v(k.size());
      cpu.matmul_qkv(wq.w, wk.w, wv.w, b0, b1, b2, host_act(x, T, n_in), host_act(q, T, nq),
                     host_act(k, T, nkv), host_act(v, T, nkv));
      DevAct xd(*be, T, n_in, &x), qd(*be, T, nq), kd(*be, T, nkv), vd(*be, T, nkv);
      be->matmul_qkv(wq.w, wk.w, wv.w, b0, b1, b2, xd.act, qd.act, kd.act, vd.act);
      EXPECT_LT(test::rel_error_f(qd.get(*be), q), 3e-2);
      EXPECT_LT(test::rel_error_f(kd.get(*be), k), 3e-2);
      EXPECT_LT(test::rel_error_f(vd.get(*be), v), 3e-2);
    }
  }
}

TEST(CudaBackendOps, RmsNormSiluGeluMulAddEqualCpu) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  CpuBackend cpu(2);
  // 1001: the plain norm; 4096 (a multiple of 32, T <= 8): the norm that
  // also writes its Q8 copy (rms_norm_q8).
  for (const int64_t n : {int64_t{1001}, int64_t{4096}}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const int64_t T = 5;
    HostWeight w(DType::kF32, 1, n, 60);
    auto a = test::random_floats(static_cast<size_t>(T * n), 61, 3.0f);
    auto b = test::random_floats(static_cast<size_t>(T * n), 62, 3.0f);
    DevAct ad(*be, T, n, &a), bd(*be, T, n, &b), out(*be, T, n);
    std::vector<float> want(a.size());

    cpu.rms_norm(host_act(a, T, n), w.w, 1e-5f, host_act(want, T, n));
    be->rms_norm(ad.act, w.w, 1e-5f, out.act);
    EXPECT_LT(test::rel_error_f(out.get(*be), want), 1e-5);

    cpu.silu_mul(host_act(a, T, n), host_act(b, T, n), host_act(want, T, n));
    be->silu_mul(ad.act, bd.act, out.act);
    EXPECT_LT(test::rel_error_f(out.get(*be), want), 1e-5);

    cpu.gelu_mul(host_act(a, T, n), host_act(b, T, n), host_act(want, T, n));
    be->gelu_mul(ad.act, bd.act, out.act);
    EXPECT_LT(test::rel_error_f(out.get(*be), want), 1e-5);

    cpu.add(host_act(a, T, n), host_act(b, T, n), host_act(want, T, n));
    be->add(ad.act, bd.act, out.act);
    EXPECT_EQ(out.get(*be), want);

    // In place, as the forward pass calls them (out aliases an input).
    be->add(ad.act, bd.act, ad.act);
    EXPECT_EQ(ad.get(*be), want);
  }
}

// The decode attention writes the Q8 activations of the o product with its
// output (after a norm has made the buffers): attention then matmul_add
// (Q4_0 o, a Q8 copy taken from the attention) against the CPU's.
TEST(CudaBackendOps, AttentionThenOProductEqualsCpu) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  CpuBackend cpu(2);
  const int64_t n_heads = 8, n_kv = 2, hd = 64, width = n_heads * hd, n_ctx = 600;
  const KvCacheConfig cfg{2, n_kv, hd, n_ctx, 32, DType::kF16};
  auto kc = KvCache::create(cfg), kg = KvCache::create(cfg);
  ASSERT_TRUE(kc.ok() && kg.ok());
  auto st = be->create_kv_storage(cfg);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_TRUE((*kg)->attach_storage(std::move(st).value()).ok());
  ASSERT_TRUE((*kg)->move_layer(1, true).ok());
  HostWeight norm_w(DType::kF32, 1, width, 300), wo(DType::kQ4_0, 256, width, 301);
  int64_t n = 0;
  // 500 keys: several splits and the merge; then one more token (the plan's
  // bucket of 512: splits too).
  for (const int64_t T : {500, 1, 3}) {
    SCOPED_TRACE("T " + std::to_string(T));
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(n + t);
    ASSERT_TRUE((*kc)->reserve(n + T).ok());
    ASSERT_TRUE((*kg)->reserve(n + T).ok());
    auto k = test::random_floats(static_cast<size_t>(T * n_kv * hd), 310 + n);
    auto v = test::random_floats(static_cast<size_t>(T * n_kv * hd), 320 + n);
    auto q = test::random_floats(static_cast<size_t>(T * width), 330 + n, 2.0f);
    auto x = test::random_floats(static_cast<size_t>(T * width), 340 + n);
    auto y = test::random_floats(static_cast<size_t>(T * 256), 350 + n);
    cpu.kv_store(**kc, 1, host_act(k, T, n_kv * hd), host_act(v, T, n_kv * hd), pos.data());
    (*kc)->set_n_tokens(n + T);
    std::vector<float> att(q.size()), want = y, tmp(y.size());
    cpu.attention(**kc, 1, host_act(q, T, width), pos.data(), n_heads, 0.125f,
                  host_act(att, T, width));
    cpu.matmul_add(wo.w, host_act(att, T, width), host_act(want, T, 256), host_act(tmp, T, 256));
    DevAct kd(*be, T, n_kv * hd, &k), vd(*be, T, n_kv * hd, &v), qd(*be, T, width, &q),
        od(*be, T, width), xd(*be, T, width, &x), nd(*be, T, width), yd(*be, T, 256, &y),
        td(*be, T, 256);
    be->kv_store(**kg, 1, kd.act, vd.act, pos.data());
    (*kg)->set_n_tokens(n + T);
    be->rms_norm(xd.act, norm_w.w, 1e-5f, nd.act);  // makes the Q8 buffers (T <= 8)
    be->attention(**kg, 1, qd.act, pos.data(), n_heads, 0.125f, od.act);
    be->matmul_add(wo.w, od.act, yd.act, td.act);
    EXPECT_LT(test::rel_error_f(od.get(*be), att), 2e-3);
    EXPECT_LT(test::rel_error_f(yd.get(*be), want), 5e-3);
    n += T;
  }
}

// rope_qk_kv: RoPE of q and k and the KV store in one launch (rope_kv_store)
// against the CPU's rope_qk then kv_store: the rotated q and k, and the
// attention over what was stored (F16 and Q8_0 caches, normal and NeoX).
TEST(CudaBackendOps, RopeQkKvEqualsCpu) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  CpuBackend cpu(2);
  for (DType kvt : {DType::kF16, DType::kQ8_0}) {
    for (const bool neox : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(kvt)) + (neox ? " neox" : " normal"));
      const int64_t n_heads = 8, n_kv = 2, hd = 64, n_ctx = 64;
      const KvCacheConfig cfg{2, n_kv, hd, n_ctx, 32, kvt};
      auto kc = KvCache::create(cfg), kg = KvCache::create(cfg);
      ASSERT_TRUE(kc.ok() && kg.ok());
      auto st = be->create_kv_storage(cfg);
      ASSERT_TRUE(st.ok()) << st.message();
      ASSERT_TRUE((*kg)->attach_storage(std::move(st).value()).ok());
      ASSERT_TRUE((*kg)->move_layer(1, true).ok());
      cpu::RopeParams p;
      p.n_rot = hd;
      p.neox = neox;
      int64_t n = 0;
      for (const int64_t T : {5, 1, 1}) {
        std::vector<int32_t> pos(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(n + t);
        ASSERT_TRUE((*kc)->reserve(n + T).ok());
        ASSERT_TRUE((*kg)->reserve(n + T).ok());
        auto k = test::random_floats(static_cast<size_t>(T * n_kv * hd), 180 + n);
        auto v = test::random_floats(static_cast<size_t>(T * n_kv * hd), 190 + n);
        auto q = test::random_floats(static_cast<size_t>(T * n_heads * hd), 200 + n, 2.0f);
        DevAct kd(*be, T, n_kv * hd, &k), vd(*be, T, n_kv * hd, &v), qd(*be, T, n_heads * hd, &q),
            od(*be, T, n_heads * hd);
        cpu.rope_qk(host_act(q, T, n_heads * hd), host_act(k, T, n_kv * hd), n_heads, n_kv, hd,
                    pos.data(), p);
        cpu.kv_store(**kc, 1, host_act(k, T, n_kv * hd), host_act(v, T, n_kv * hd), pos.data());
        be->rope_qk_kv(qd.act, kd.act, vd.act, **kg, 1, n_heads, n_kv, hd, pos.data(), p);
        const auto gq = qd.get(*be), gk = kd.get(*be);
        for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(gq[i], q[i], 1e-5f) << "q " << i;
        for (size_t i = 0; i < k.size(); ++i) ASSERT_NEAR(gk[i], k[i], 1e-5f) << "k " << i;
        (*kc)->set_n_tokens(n + T);
        (*kg)->set_n_tokens(n + T);
        std::vector<float> want(q.size());
        cpu.attention(**kc, 1, host_act(q, T, n_heads * hd), pos.data(), n_heads, 0.125f,
                      host_act(want, T, n_heads * hd));
        be->attention(**kg, 1, qd.act, pos.data(), n_heads, 0.125f, od.act);
        EXPECT_LT(test::rel_error_f(od.get(*be), want), 2e-3) << "T " << T;
        n += T;
      }
    }
  }
}

TEST(CudaBackendOps, RopeEqualsCpu) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  CpuBackend cpu(2);
  const int64_t T = 3, n_heads = 5, head_dim = 64;
  const std::vector<int32_t> pos = {0, 17, 4095};
  std::vector<float> factors(32);
  for (size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0f + 0.25f * static_cast<float>(i);
  struct Variant {
    const char* name;
    cpu::RopeParams p;
  };
  std::vector<Variant> vs;
  cpu::RopeParams p;
  p.n_rot = 64;
  vs.push_back({"normal", p});
  p.neox = true;
  vs.push_back({"neox", p});
  p.n_rot = 32;
  vs.push_back({"neox partial", p});
  p.n_rot = 64;
  p.freq_factors = factors.data();
  p.freq_base = 500000.0f;
  vs.push_back({"freq factors", p});
  cpu::RopeParams y;
  y.n_rot = 64;
  y.neox = true;
  y.freq_scale = 0.25f;
  y.ext_factor = 1.0f;
  y.n_ctx_orig = 4096;
  y.attn_factor = 1.0f;
  vs.push_back({"yarn", y});
  for (const Variant& v : vs) {
    SCOPED_TRACE(v.name);
    auto x = test::random_floats(static_cast<size_t>(T * n_heads * head_dim), 70);
    DevAct xd(*be, T, n_heads * head_dim, &x);
    cpu.rope(host_act(x, T, n_heads * head_dim), n_heads, head_dim, pos.data(), v.p);
    be->rope(xd.act, n_heads, head_dim, pos.data(), v.p);
    const auto got = xd.get(*be);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(got[i], x[i], 1e-5f) << i;
  }
}

TEST(CudaBackendOps, KvStoreAndAttentionEqualCpu) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  CpuBackend cpu(2);
  for (DType kvt : {DType::kF16, DType::kQ8_0}) {
    for (const int64_t n_kv : {int64_t{2}, int64_t{8}}) {
      SCOPED_TRACE(std::string(dtype_name(kvt)) + " kv heads " + std::to_string(n_kv));
      const int64_t n_heads = 8, hd = 64, n_ctx = 300;
      const KvCacheConfig cfg{2, n_kv, hd, n_ctx, 32, kvt};
      auto kc = KvCache::create(cfg), kg = KvCache::create(cfg);
      ASSERT_TRUE(kc.ok() && kg.ok());
      auto st = be->create_kv_storage(cfg);
      ASSERT_TRUE(st.ok()) << st.message();
      ASSERT_TRUE((*kg)->attach_storage(std::move(st).value()).ok());
      ASSERT_TRUE((*kg)->move_layer(1, true).ok());
      const float scale = 0.125f;
      int64_t n = 0;
      // A 70-token prefill, then three single-token steps.
      for (const int64_t T : {70, 1, 1, 1}) {
        std::vector<int32_t> pos(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(n + t);
        ASSERT_TRUE((*kc)->reserve(n + T).ok());
        ASSERT_TRUE((*kg)->reserve(n + T).ok());
        auto k = test::random_floats(static_cast<size_t>(T * n_kv * hd), 80 + n);
        auto v = test::random_floats(static_cast<size_t>(T * n_kv * hd), 90 + n);
        auto q = test::random_floats(static_cast<size_t>(T * n_heads * hd), 100 + n, 2.0f);
        std::vector<float> want(q.size());
        cpu.kv_store(**kc, 1, host_act(k, T, n_kv * hd), host_act(v, T, n_kv * hd), pos.data());
        (*kc)->set_n_tokens(n + T);
        cpu.attention(**kc, 1, host_act(q, T, n_heads * hd), pos.data(), n_heads, scale,
                      host_act(want, T, n_heads * hd));
        DevAct kd(*be, T, n_kv * hd, &k), vd(*be, T, n_kv * hd, &v), qd(*be, T, n_heads * hd, &q),
            od(*be, T, n_heads * hd);
        be->kv_store(**kg, 1, kd.act, vd.act, pos.data());
        (*kg)->set_n_tokens(n + T);
        be->attention(**kg, 1, qd.act, pos.data(), n_heads, scale, od.act);
        // (attention_test.cpp holds the kernels to 1e-4 of a double reference;
        // the CPU's own kernels differ from it too.)
        EXPECT_LT(test::rel_error_f(od.get(*be), want), 2e-3) << "T " << T;
        n += T;
      }
      // Moving the layer back to host blocks keeps its rows: the CPU then reads them.
      ASSERT_TRUE((*kg)->move_layer(1, false).ok());
      auto q = test::random_floats(static_cast<size_t>(n_heads * hd), 5, 2.0f);
      std::vector<float> a(q.size()), b(q.size());
      const int32_t last = static_cast<int32_t>(n - 1);
      cpu.attention(**kc, 1, host_act(q, 1, n_heads * hd), &last, n_heads, scale,
                    host_act(a, 1, n_heads * hd));
      cpu.attention(**kg, 1, host_act(q, 1, n_heads * hd), &last, n_heads, scale,
                    host_act(b, 1, n_heads * hd));
      EXPECT_EQ(a, b);
    }
  }
}

TEST(CudaBackendErrors, BadIdIsReportedBySynchronize) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  HostWeight hw(DType::kF16, 4, 64, 1);
  const int32_t id = 4;
  DevAct out(*be, 1, 64);
  be->get_rows(hw.w, &id, out.act);
  const Status s = be->synchronize();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kOutOfRange);
  EXPECT_NE(s.message().find("get_rows"), std::string::npos) << s.message();
}

TEST(CudaBackendErrors, MemoryLimitGivesOutOfMemoryNamingTheBytes) {
  std::string why = test::cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << "no CUDA device: " << why;
  CudaOptions o;
  o.memory_limit = 1ull << 20;
  auto be = CudaBackend::create(o);
  ASSERT_TRUE(be.ok()) << be.message();
  HostWeight small(DType::kF16, 16, 1024, 1), big(DType::kF16, 1024, 1024, 2);  // 32 KiB, 2 MiB
  EXPECT_TRUE((*be)->upload_weight(small.w).ok());
  const Status s = (*be)->upload_weight(big.w);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(s.message().find("MiB"), std::string::npos) << s.message();
  EXPECT_TRUE((*be)->has_weight(OpKind::kMatmul, small.w));
  EXPECT_FALSE((*be)->has_weight(OpKind::kMatmul, big.w));
  (*be)->release_weight(small.w);
  EXPECT_FALSE((*be)->has_weight(OpKind::kMatmul, small.w));
  EXPECT_EQ((*be)->weight_bytes(), 0u);
}

TEST(CudaBackendErrors, FirstFailureIsKeptAndLaterOpsSkipped) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  be->simulate_failure("simulated device loss");
  std::vector<float> a(10, 1.0f);
  DevAct ad(*be, 1, 10);
  be->add(ad.act, ad.act, ad.act);
  const Status s = be->synchronize();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("simulated"), std::string::npos);
  EXPECT_FALSE(be->upload(a.data(), ad.act).ok());
}

TEST(CudaBackendScopes, ScopeTimesComeBackAfterSynchronize) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  be->set_scope_timing(true);
  std::vector<float> a = test::random_floats(1 << 20, 1);
  DevAct ad(*be, 1, 1 << 20, &a);
  be->begin_scope(3);
  for (int i = 0; i < 10; ++i) be->add(ad.act, ad.act, ad.act);
  be->begin_scope(4);
  be->add(ad.act, ad.act, ad.act);
  be->begin_scope(-1);
  ASSERT_TRUE(be->synchronize().ok());
  std::vector<Backend::ScopeTime> t;
  be->take_scope_times(&t);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].id, 3);
  EXPECT_EQ(t[1].id, 4);
  EXPECT_GT(t[0].ns, 0u);
}

TEST(CudaDevices, ListOrReason) {
  // No device needed: either a list or a reason for the user.
  auto d = list_cuda_devices();
  if (!d.ok()) {
    EXPECT_FALSE(d.message().empty());
    GTEST_SKIP() << "no CUDA device: " << d.message();
  }
  for (const auto& info : *d) {
    EXPECT_FALSE(info.name.empty());
    if (!info.usable) {
      EXPECT_FALSE(info.why_not.empty());
    }
  }
  EXPECT_TRUE(cuda_built());
}

}  // namespace
}  // namespace loom
