#include "tests/unit/vulkan_test_util.h"

#ifdef LOOM_HAVE_VULKAN
#include <cstdio>

namespace loom::test {

namespace {
struct Shared {
  bool tried = false;
  std::unique_ptr<VulkanBackend> be;
  std::string why;
};
Shared g_main, g_fallback;  // one per test process; destroyed at exit
bool g_validation = false;
}  // namespace

// Drop the shared backends when the tests end, not at static destruction,
// when a driver's own globals may already be gone (NVIDIA crashes then).
class ReleaseAtEnd : public ::testing::Environment {
 public:
  void TearDown() override {
    g_fallback.be.reset();
    g_main.be.reset();
  }
};
[[maybe_unused]] ::testing::Environment* const g_release =
    ::testing::AddGlobalTestEnvironment(new ReleaseAtEnd);

bool vulkan_validation_on() {
  return g_validation;
}

VulkanBackend* vulkan_backend(std::string* why, bool fallbacks) {
  Shared& s = fallbacks ? g_fallback : g_main;
  if (!s.tried) {
    s.tried = true;
    VulkanOptions o;
    o.validation = true;
    o.use_subgroups = !fallbacks;
    o.use_f16_storage = !fallbacks;
    // The second backend also splits every batch into small command buffers
    // and polls fences before blocking (what GPUs do, with longer buffers and
    // polls), so tests run those paths on lavapipe too.
    if (fallbacks) {
      o.submit_every = 3;
      o.fence_spin_us = 200;
    }
    auto be = VulkanBackend::create(o);
    if (!be.ok() && be.error().code() == ErrorCode::kUnsupported &&
        be.message().find("validation") != std::string::npos) {
      std::fprintf(stderr, "note: %s; testing without it\n", be.message().c_str());
      o.validation = false;
      be = VulkanBackend::create(o);
    }
    if (be.ok()) {
      s.be = std::move(be).value();
      g_validation = o.validation;
    } else {
      s.why = be.message();
    }
  }
  if (!s.be && why) *why = s.why;
  return s.be.get();
}

}  // namespace loom::test
#endif
