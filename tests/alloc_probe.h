// Records the largest single heap allocation made while an AllocProbe lives
// (this thread only). Used to check that corrupt counts never drive allocation.
#pragma once

#include <cstddef>

namespace loom::test {

class AllocProbe {
 public:
  AllocProbe();
  ~AllocProbe();
  size_t peak_single() const;
};

}  // namespace loom::test
