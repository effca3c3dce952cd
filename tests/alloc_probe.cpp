#include "tests/alloc_probe.h"

#include <cstdlib>
#include <new>

namespace {
thread_local bool g_active = false;
thread_local size_t g_peak = 0;

void* counted_alloc(size_t n) {
  if (g_active && n > g_peak) g_peak = n;
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}

// Replacing the global allocation functions is allowed by the standard; under
// ASan the sanitizer's own interceptors still see the malloc underneath.
void* counted_alloc_nothrow(size_t n) noexcept {
  if (g_active && n > g_peak) g_peak = n;
  return std::malloc(n ? n : 1);
}
}  // namespace

// Every replaceable form that plain new/delete pairs with, so memory from one
// family is never released by another (ASan checks the pairing).
void* operator new(size_t n) {
  return counted_alloc(n);
}
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  return counted_alloc_nothrow(n);
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  return counted_alloc_nothrow(n);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void* operator new[](size_t n) {
  return counted_alloc(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t) noexcept {
  std::free(p);
}

namespace loom::test {
AllocProbe::AllocProbe() {
  g_active = true;
  g_peak = 0;
}
AllocProbe::~AllocProbe() {
  g_active = false;
}
size_t AllocProbe::peak_single() const {
  return g_peak;
}
}  // namespace loom::test
