#include "engine/model/convert.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "cpu/ref/quants.h"
#include "engine/model/gguf.h"
#include "engine/model/gguf_writer.h"
#include "engine/model/hf_model.h"
#include "engine/tokenizer/vocab_writer.h"

namespace loom {

namespace {

namespace fs = std::filesystem;

// Hands the whole pages of [p, p + n) back to the kernel: file pages are
// dropped (read again from the file if touched), anonymous ones swapped; the
// contents stay valid either way. Resident memory then stays near one batch.
void release_pages(const void* p, size_t n) {
#ifdef MADV_PAGEOUT
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t begin = (a + page - 1) / page * page, end = (a + n) / page * page;
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT);
#else
  (void)p;
  (void)n;
#endif
}

Result<std::string> read_text_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    return make_error(ErrorCode::kIo, "%s: cannot open: %s", p.string().c_str(),
                      std::strerror(errno));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Source {
  std::unique_ptr<GgufFile> file;
  bool rope_neox_layout = false;
  std::string chat_template;
  std::string tokenizer_json, tokenizer_config_json;  ///< HF folder's, verbatim
  std::optional<Vocab> vocab;  ///< what Loom read from the folder's tokenizer.json
};

Result<Source> open_source(const std::string& path) {
  Source s;
  if (is_hf_folder(path)) {
    std::error_code ec;
    const fs::path tok = fs::path(path) / "tokenizer.json";
    const bool has_tok = fs::is_regular_file(tok, ec);
    const bool has_spm = fs::is_regular_file(fs::path(path) / "tokenizer.model", ec);
    // Opening with the tokenizer checks it parses before anything is written.
    LOOM_ASSIGN_OR_RETURN(HfFolder hf, open_hf_folder(path, /*need_tokenizer=*/has_tok || has_spm));
    s.file = std::move(hf.file);
    s.rope_neox_layout = hf.rope_neox_layout;
    s.chat_template = hf.chat_template;
    if (has_tok) {
      LOOM_ASSIGN_OR_RETURN(s.tokenizer_json, read_text_file(tok));
    }
    if (has_tok || has_spm) s.vocab = std::move(hf.vocab);
    const fs::path cfg = fs::path(path) / "tokenizer_config.json";
    if (fs::is_regular_file(cfg, ec)) {
      LOOM_ASSIGN_OR_RETURN(s.tokenizer_config_json, read_text_file(cfg));
    }
    return s;
  }
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    return make_error(ErrorCode::kFormat,
                      "%s: a folder without config.json: neither a GGUF file nor a Hugging Face "
                      "model folder",
                      path.c_str());
  }
  LOOM_ASSIGN_OR_RETURN(s.file, GgufFile::open(path));
  return s;
}

int64_t int_key(const GgufFile& f, const std::string& key, int64_t dflt) {
  auto v = f.get_int(key);
  return v.ok() && *v ? **v : dflt;
}

// One output tensor: where its rows come from and what they become.
struct Plan {
  const GgufTensor* src;
  DType to;
  int64_t n_in = 0, n_rows = 0;
  uint64_t src_row = 0, dst_row = 0;
  int64_t head_rows = 0;  ///< > 0: rows permuted from rotate_half order, per head of this many
};

// Output row r of a head of `hr` rows comes from source row (r % 2) * hr/2 + r / 2:
// HF's rotate_half pairs (i, i + hr/2) become GGUF's adjacent pairs (2i, 2i + 1).
int64_t source_row(int64_t r, int64_t hr) {
  if (hr <= 0) return r;
  const int64_t head = r / hr, k = r % hr;
  return head * hr + (k % 2) * (hr / 2) + k / 2;
}

Status convert_rows(const Plan& p, int64_t r0, int64_t n, uint8_t* dst, int n_threads) {
  const uint8_t* base = p.src->data;
  if (p.src->dtype == p.to) {
    for (int64_t r = r0; r < r0 + n; ++r) {
      std::memcpy(dst + static_cast<size_t>(r - r0) * p.dst_row,
                  base + static_cast<size_t>(source_row(r, p.head_rows)) * p.src_row, p.src_row);
    }
    return {};
  }
  const int nt = static_cast<int>(std::clamp<int64_t>(n / 16, 1, n_threads));
  std::vector<Status> errs(static_cast<size_t>(nt));
  auto work = [&](int t) {
    std::vector<float> tmp(static_cast<size_t>(p.n_in));
    for (int64_t r = r0 + n * t / nt; r < r0 + n * (t + 1) / nt; ++r) {
      const uint8_t* s = base + static_cast<size_t>(source_row(r, p.head_rows)) * p.src_row;
      Status st = ref::dequantize_row(p.src->dtype, s, tmp.data(), p.n_in);
      if (st.ok()) {
        st = ref::quantize_row(p.to, tmp.data(), dst + static_cast<size_t>(r - r0) * p.dst_row,
                               p.n_in);
      }
      if (!st.ok()) {
        errs[static_cast<size_t>(t)] = st;
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < nt; ++t) threads.emplace_back(work, t);
  work(0);
  for (auto& th : threads) th.join();
  for (const Status& s : errs) LOOM_TRY(s);
  return {};
}

bool is_float_type(DType d) {
  return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16;
}

}  // namespace

Result<int64_t> model_block_count(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(Source s, open_source(path));
  const std::string arch = s.file->architecture();
  const int64_t n = int_key(*s.file, arch + ".block_count", -1);
  if (n < 0) {
    return make_error(ErrorCode::kFormat, "%s: no %s.block_count", path.c_str(), arch.c_str());
  }
  return n;
}

Result<ConvertReport> convert_model(const ConvertOptions& o) {
  LOOM_ASSIGN_OR_RETURN(Source src, open_source(o.input));
  const GgufFile& f = *src.file;
  {
    std::error_code ec;
    if (fs::exists(o.output, ec) && fs::equivalent(o.input, o.output, ec)) {
      return make_error(ErrorCode::kInvalidArgument, "%s: the output would overwrite the input",
                        o.output.c_str());
    }
  }
  const std::string arch = f.architecture();
  const int64_t n_head = int_key(f, arch + ".attention.head_count", 0);
  const int64_t n_head_kv = int_key(f, arch + ".attention.head_count_kv", n_head);

  ConvertReport rep;
  GgufWriter w;
  bool changed_types = false;
  std::vector<Plan> plans;
  for (const GgufTensor& t : f.tensors()) {
    Plan p;
    p.src = &t;
    p.n_in = t.ne[0];
    p.n_rows =
        t.ne[0] > 0 ? static_cast<int64_t>(t.n_elements() / static_cast<uint64_t>(t.ne[0])) : 0;
    const bool matrix = t.n_dims >= 2 && p.n_rows > 1;
    DType to = t.dtype;
    if (!matrix) {
      to = DType::kF32;  // vectors (norms, biases, RoPE factors) as GGUF keeps them
    } else {
      std::optional<DType> want = o.dtype_for ? o.dtype_for(t.name) : std::nullopt;
      if (!want) want = o.dtype;
      if (want) to = *want;
    }
    if (to != t.dtype) {
      if (!ref::has_reference(t.dtype)) {
        return make_error(ErrorCode::kUnsupported, "%s: tensor '%s' is %s, which Loom cannot read",
                          o.input.c_str(), t.name.c_str(),
                          std::string(dtype_name(t.dtype)).c_str());
      }
      if (!ref::has_reference(to)) {
        return make_error(ErrorCode::kUnsupported, "no quantizer for %s (tensor '%s')",
                          std::string(dtype_name(to)).c_str(), t.name.c_str());
      }
      if (!dtype_row_bytes(to, static_cast<uint64_t>(p.n_in))) {
        const DType keep = is_float_type(t.dtype) ? t.dtype : DType::kF16;
        rep.notes.push_back("tensor '" + t.name + "' kept in " + std::string(dtype_name(keep)) +
                            ": rows of " + std::to_string(p.n_in) +
                            " values are not a multiple "
                            "of " +
                            std::string(dtype_name(to)) + "'s block");
        to = keep;
      }
    }
    p.to = to;
    changed_types |= to != t.dtype;
    const auto sr = dtype_row_bytes(t.dtype, static_cast<uint64_t>(p.n_in));
    const auto dr = dtype_row_bytes(to, static_cast<uint64_t>(p.n_in));
    if (!sr || !dr || *sr * static_cast<uint64_t>(p.n_rows) != t.n_bytes) {
      return make_error(ErrorCode::kFormat, "%s: tensor '%s': %" PRIu64 " bytes for its shape",
                        o.input.c_str(), t.name.c_str(), t.n_bytes);
    }
    p.src_row = *sr;
    p.dst_row = *dr;
    // HF llama-family q/k rows: into GGUF's RoPE pair order.
    if (src.rope_neox_layout && matrix) {
      const bool q = t.name.ends_with(".attn_q.weight"), k = t.name.ends_with(".attn_k.weight");
      const int64_t heads = q ? n_head : (k ? n_head_kv : 0);
      if (heads > 0) {
        if (p.n_rows % heads != 0 || (p.n_rows / heads) % 2 != 0) {
          return make_error(ErrorCode::kFormat,
                            "%s: tensor '%s' has %" PRId64 " rows, not %" PRId64
                            " heads of an even size",
                            o.input.c_str(), t.name.c_str(), p.n_rows, heads);
        }
        p.head_rows = p.n_rows / heads;
      }
    }
    std::vector<int64_t> shape(t.ne, t.ne + std::max<uint32_t>(t.n_dims, 1));
    LOOM_TRY(w.add_tensor(t.name, shape, to));
    rep.bytes_in += t.n_bytes;
    rep.bytes_out += *dr * static_cast<uint64_t>(p.n_rows);
    rep.by_dtype[to]++;
    plans.push_back(p);
  }
  rep.n_tensors = static_cast<int64_t>(plans.size());

  // Metadata: the source's keys (the writer sets its own alignment; a changed
  // precision makes general.file_type wrong, so it goes).
  for (const auto& [key, value] : f.metadata()) {
    if (key == "general.alignment") continue;
    if (key == "general.file_type" && changed_types) continue;
    w.set_value(key, value);
  }
  // A folder's vocabulary (tokenizer.json or tokenizer.model) as the standard
  // keys for every GGUF reader; tokenizer.json also verbatim (Loom prefers it).
  if (src.vocab) {
    write_vocab_metadata(*src.vocab, &w);
    if (!src.tokenizer_json.empty()) w.set_string(kHfTokenizerJsonKey, src.tokenizer_json);
    if (!src.tokenizer_config_json.empty())
      w.set_string(kHfTokenizerConfigKey, src.tokenizer_config_json);
    if (!src.chat_template.empty()) w.set_string("tokenizer.chat_template", src.chat_template);
  }
  if (src.rope_neox_layout) w.set_string("general.source", "huggingface (q/k rows permuted)");

  // The output under a temporary name, renamed when complete.
  const fs::path out(o.output);
  std::string tmp_name = ".";
  tmp_name.append(out.filename().string());
  tmp_name.append(".partial-");
  tmp_name.append(std::to_string(static_cast<long long>(getpid())));
  const std::string tmp = (out.parent_path() / tmp_name).string();
  auto fail = [&](Status s) -> Result<ConvertReport> {
    std::remove(tmp.c_str());
    return s;
  };
  if (Status s = w.open(tmp); !s.ok()) {
    // Name the file the user asked for, not the temporary one.
    return fail(make_error(s.error().code(), "%s: cannot be written: %s", o.output.c_str(),
                           s.message().c_str()));
  }
  const int n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<uint8_t> buf;
  uint64_t done = 0;
  for (const Plan& p : plans) {
    int64_t batch = std::max<int64_t>(
        1, static_cast<int64_t>(o.batch_bytes / std::max<uint64_t>(p.dst_row, 1)));
    if (p.head_rows > 0) batch = std::max<int64_t>(1, batch / p.head_rows) * p.head_rows;
    for (int64_t r0 = 0; r0 < p.n_rows; r0 += batch) {
      const int64_t n = std::min(batch, p.n_rows - r0);
      buf.resize(static_cast<size_t>(n) * p.dst_row);
      if (Status s = convert_rows(p, r0, n, buf.data(), n_threads); !s.ok()) {
        (void)w.close();
        return fail(make_error(s.error().code(), "%s: tensor '%s': %s", o.input.c_str(),
                               p.src->name.c_str(), s.message().c_str()));
      }
      if (Status s = w.write_data(buf.data(), buf.size()); !s.ok()) {
        (void)w.close();
        return fail(make_error(s.error().code(), "%s: writing failed (%s); nothing was kept",
                               o.output.c_str(), s.message().c_str()));
      }
      // Batches cover whole heads, so their source rows are one contiguous range.
      release_pages(p.src->data + static_cast<size_t>(r0) * p.src_row,
                    static_cast<size_t>(n) * p.src_row);
      done += buf.size();
      if (o.progress && !o.progress(done, rep.bytes_out)) {
        (void)w.close();
        return fail(make_error(ErrorCode::kCancelled, "conversion cancelled"));
      }
    }
  }
  if (Status s = w.close(); !s.ok()) {
    return fail(make_error(s.error().code(), "%s: writing failed (%s); nothing was kept",
                           o.output.c_str(), s.message().c_str()));
  }
  std::error_code ec;
  fs::rename(tmp, out, ec);
  if (ec) {
    return fail(make_error(ErrorCode::kIo, "%s: cannot be written: %s", o.output.c_str(),
                           ec.message().c_str()));
  }
  return rep;
}

}  // namespace loom
