// libFuzzer target for the safetensors reader: any bytes must give a parsed
// file whose tensors lie inside the input and do not overlap, or an error with
// a message; never a crash, a hang or an allocation out of proportion.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "engine/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = loom::SafetensorsFile::from_memory(data, size, "fuzz.safetensors");
  if (!r.ok()) {
    if (r.message().empty()) std::abort();
    return 0;
  }
  const loom::SafetensorsFile& f = **r;
  uint64_t sum = 0;
  const uint8_t* prev_end = data;
  for (const auto& t : f.tensors()) {
    if (t.data < data || t.data + t.n_bytes > data + size) std::abort();
    if (t.n_bytes > 0 && t.data < prev_end) std::abort();  // sorted by offset, no overlap
    if (t.n_bytes > 0) {
      prev_end = t.data + t.n_bytes;
      sum += t.data[0] + t.data[t.n_bytes - 1];  // touch both ends
    }
    sum += t.n_elements() + t.shape_string().size();
    if (f.find_tensor(t.name) != &t) std::abort();
  }
  for (const auto& [k, v] : f.metadata()) sum += k.size() + v.size();
  return sum == 0xdeadbeef ? 1 : 0;
}
