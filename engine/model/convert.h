// Model conversion to GGUF (`loom convert`): a GGUF file or a Hugging Face
// folder in, a GGUF file out, each matrix in the precision asked for.
//
// Streaming: tensors are read from the source's memory map and written in
// batches of rows (dequantize -> reference quantizer -> write), and each
// batch's source pages are handed back to the kernel once written
// (MADV_PAGEOUT), so resident memory stays near one batch (a few MiB) plus the
// largest vector, not the model. The output is written under a temporary name
// in the output's folder and renamed at the end: on any error (a full disk,
// an unreadable source) no partial file is left behind.
//
// From a Hugging Face folder: config.json's hyper-parameters become GGUF keys
// (as load_model reads them), tensors get GGUF names, the llama family's q/k
// rows are permuted from HF's rotate_half order into GGUF's adjacent pairs
// (as GGUF converters do), vectors become F32, and the folder's tokenizer.json
// and tokenizer_config.json are embedded verbatim (keys `loom.hf.tokenizer_json`
// and `loom.hf.tokenizer_config_json`; load_model reads them), with the chat
// template also under `tokenizer.chat_template`. The vocabulary Loom read from
// them is also written as the standard `tokenizer.ggml.*` keys
// (engine/tokenizer/vocab_writer.h), for llama.cpp and the programs built on it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace loom {

/// Metadata keys of a Hugging Face tokenizer embedded in a converted GGUF.
inline constexpr const char* kHfTokenizerJsonKey = "loom.hf.tokenizer_json";
inline constexpr const char* kHfTokenizerConfigKey = "loom.hf.tokenizer_config_json";

struct ConvertOptions {
  std::string input;   ///< a GGUF file or a Hugging Face folder
  std::string output;  ///< the GGUF file to write
  /// Precision of every matrix (vectors stay F32); empty: the source's.
  std::optional<DType> dtype;
  /// Per tensor (GGUF name, e.g. from a placement's op groups): a precision
  /// that overrides `dtype`, or nullopt for `dtype`. May be empty.
  std::function<std::optional<DType>(const std::string& name)> dtype_for;
  /// Rows are converted in batches of about this many output bytes.
  uint64_t batch_bytes = 4ull << 20;
  /// (bytes written, total bytes); returning false cancels (kCancelled).
  std::function<bool(uint64_t, uint64_t)> progress;
};

struct ConvertReport {
  int64_t n_tensors = 0;
  uint64_t bytes_in = 0;              ///< source tensor bytes
  uint64_t bytes_out = 0;             ///< output tensor bytes
  std::map<DType, int64_t> by_dtype;  ///< tensors written in each dtype
  std::vector<std::string> notes;     ///< tensors kept in another precision, and why
};

/// Converts `o.input` to `o.output`. Errors name the file (the input's reader
/// errors, a tensor that has no quantizer for the pair, the output that cannot
/// be created or written) and leave no output file.
Result<ConvertReport> convert_model(const ConvertOptions& o);

/// The `<arch>.block_count` of a GGUF file or Hugging Face folder (to load a
/// placement for it).
Result<int64_t> model_block_count(const std::string& path);

}  // namespace loom
