// What the Vulkan test suites share: one backend per test process (instance,
// device and pipelines are slow to make on lavapipe), created with the
// Khronos validation layer when it is installed, and a skip with the reason
// when there is no Vulkan loader or device.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "engine/backends/vulkan/vulkan.h"
#ifdef LOOM_HAVE_VULKAN
#include "engine/backends/vulkan/vulkan_backend.h"
#endif

namespace loom::test {

#ifdef LOOM_HAVE_VULKAN
/// The process's shared backend (validation on where available), or null with
/// `*why` saying why there is none. `fallbacks`: a second backend with
/// subgroups and 16-bit storage turned off, to test the other shader variants.
VulkanBackend* vulkan_backend(std::string* why, bool fallbacks = false);
/// Whether the shared backends run with the validation layer.
bool vulkan_validation_on();
#endif

}  // namespace loom::test

#ifdef LOOM_HAVE_VULKAN
/// Declares `var` (VulkanBackend*) or skips the test, saying why.
#define LOOM_VULKAN_OR_SKIP(var, fallbacks)                      \
  VulkanBackend* var = nullptr;                                  \
  do {                                                           \
    std::string loom_why_;                                       \
    var = ::loom::test::vulkan_backend(&loom_why_, fallbacks);   \
    if (!var) GTEST_SKIP() << "no Vulkan device: " << loom_why_; \
  } while (0)
#endif
