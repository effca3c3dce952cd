// cuBLAS opened at run time (dlopen), so that Loom's binaries do not depend
// on libcublas: a machine without it still runs, and the CUDA backend says
// cuBLAS is missing. Only the entry points Loom calls are looked up.
#pragma once

#include <cublas_api.h>  // types and enums only: nothing is linked

#include <string>

#include "engine/core/status.h"

namespace loom::cuda {

/// The cuBLAS functions Loom uses, from one opened copy of the library.
struct CublasApi {
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t) = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t) = nullptr;
  /// Optional (older libraries lack it): null then.
  const char* (*get_status_string)(cublasStatus_t) = nullptr;
  std::string path;  ///< the library that was opened

  /// "CUBLAS_STATUS_..." text of a status, or its number.
  std::string describe(cublasStatus_t st) const;
};

/// Opens cuBLAS once per process (later calls return the same table):
/// libcublas.so.13, libcublas.so, then the CUDA toolkit's lib64 folders.
/// kUnsupported naming every path tried when none opens or a symbol is missing.
Result<const CublasApi*> load_cublas();

}  // namespace loom::cuda
