// libFuzzer target for the GGUF reader: any bytes must give a parsed file whose
// tensors lie inside the input, or an error with a message; never a crash,
// a hang or an allocation out of proportion to the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "engine/model/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = loom::GgufFile::from_memory(data, size, "fuzz.gguf");
  if (!r.ok()) {
    if (r.message().empty()) std::abort();
    return 0;
  }
  const loom::GgufFile& f = **r;
  uint64_t sum = 0;
  for (const auto& t : f.tensors()) {
    if (t.data < data || t.data + t.n_bytes > data + size) std::abort();
    if (t.n_bytes > 0) sum += t.data[0] + t.data[t.n_bytes - 1];  // touch both ends
  }
  for (const auto& [key, v] : f.metadata()) {
    sum += key.size() + v.array_size();
    (void)f.get_string(key);
    (void)f.get_int(key);
    (void)f.get_float_array(key);
  }
  (void)f.architecture();
  return sum == 0xdeadbeef ? 1 : 0;
}
