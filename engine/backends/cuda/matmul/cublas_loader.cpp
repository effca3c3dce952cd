#include "engine/backends/cuda/matmul/cublas_loader.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace loom::cuda {

namespace {

// Loaded once; the library stays open for the life of the process.
struct Loaded {
  CublasApi api;
  bool ok = false;
  std::string error;
};

template <typename Fn>
bool sym(void* lib, const char* name, Fn* out, std::string* missing) {
  void* p = dlsym(lib, name);
  if (!p) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
    return false;
  }
  *out = reinterpret_cast<Fn>(p);
  return true;
}

Loaded load() {
  Loaded r;
  const char* const kCandidates[] = {
      "libcublas.so.13",
      "libcublas.so",
      "/usr/local/cuda/lib64/libcublas.so.13",
      "/usr/local/cuda/lib64/libcublas.so",
      "/usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.13",
      "/usr/local/cuda/targets/x86_64-linux/lib/libcublas.so",
  };
  void* lib = nullptr;
  std::string tried;
  for (const char* c : kCandidates) {
    lib = dlopen(c, RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      r.api.path = c;
      break;
    }
    const char* why = dlerror();
    tried += std::string("\n  ") + c + ": " + (why ? why : "not found");
  }
  if (!lib) {
    r.error =
        "cuBLAS (libcublas.so.13, from the CUDA toolkit or the libcublas package) could not be "
        "opened; the prompt GEMMs need it. Tried:" +
        tried;
    return r;
  }
  std::string missing;
  bool ok = sym(lib, "cublasCreate_v2", &r.api.create, &missing);
  ok &= sym(lib, "cublasDestroy_v2", &r.api.destroy, &missing);
  ok &= sym(lib, "cublasSetStream_v2", &r.api.set_stream, &missing);
  ok &= sym(lib, "cublasSetMathMode", &r.api.set_math_mode, &missing);
  ok &= sym(lib, "cublasGemmEx", &r.api.gemm_ex, &missing);
  std::string optional_missing;
  (void)sym(lib, "cublasGetStatusString", &r.api.get_status_string, &optional_missing);
  if (!ok) {
    r.error = r.api.path + " lacks " + missing + ": an older or broken cuBLAS";
    dlclose(lib);
    return r;
  }
  r.ok = true;
  return r;
}

}  // namespace

std::string CublasApi::describe(cublasStatus_t st) const {
  if (get_status_string) {
    const char* s = get_status_string(st);
    if (s) return s;
  }
  return "cuBLAS status " + std::to_string(static_cast<int>(st));
}

Result<const CublasApi*> load_cublas() {
  static std::once_flag once;
  static Loaded loaded;
  std::call_once(once, [] { loaded = load(); });
  if (!loaded.ok) return make_error(ErrorCode::kUnsupported, "%s", loaded.error.c_str());
  return &loaded.api;
}

}  // namespace loom::cuda
