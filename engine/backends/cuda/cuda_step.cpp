// Steps of the CUDA backend as CUDA graphs (see cuda_backend.h): a decode
// step is some 400 launches and ring copies; captured once into a graph, a
// step is one cudaGraphLaunch. LOOM_CUDA_GRAPHS=0 turns it off (begin_step).
#include <cstdlib>
#include <cstring>

#include "engine/backends/cuda/cuda_backend.h"

namespace loom {

namespace {

constexpr size_t kMaxGraphs = 8;  // hashes kept (a context bucket or placement each)

}  // namespace

void CudaBackend::begin_step() {
  finish_step();  // a step left open (no download since) ends here
  if (!graphs_on_ || scope_on_ || !status_.ok()) return;
  // On unless LOOM_CUDA_GRAPHS=0. Measured on the H200 (llama3-8b Q4_0,
  // 2026-12-04): 265.1 tokens/s replayed against 259.5 op by op. (Before the
  // repeated ring copies and the second RoPE launch were cut, replay lost,
  // 234.0 against 247.6: a graph starts only after the host part of the
  // whole step, where op by op the GPU starts on the first launch.)
  const char* env = std::getenv("LOOM_CUDA_GRAPHS");
  if (env && std::strcmp(env, "0") == 0) return;
  stepping_ = true;
  ++step_serial_;
  // Graphs hold the scratch buffers' addresses: a buffer that grew was
  // reallocated (the scratch only grows), so its size names it.
  step_hash_ = 0xcbf29ce484222325ull ^ matmul_->scratch_bytes();
  step_hash_ = (step_hash_ ^ attn_scratch_->bytes()) * 0x100000001b3ull;
  step_hash_ = (step_hash_ ^ ring_bytes_ ^ (ring_used_ << 32)) * 0x100000001b3ull;
  // Graphs copy from the KV tier's pinned host blocks: none from slabs since freed.
  step_hash_ = (step_hash_ ^ cuda::CudaKvStorage::slabs_freed()) * 0x100000001b3ull;
  // A graph keeps its launches' programmatic edges (pdl.cuh).
  step_hash_ = (step_hash_ ^ (cuda::chained_launches() ? 1u : 0u)) * 0x100000001b3ull;
  step_ops_.clear();
}

void CudaBackend::finish_step() {
  if (!stepping_) return;
  stepping_ = false;
  ++step_serial_;
  std::vector<std::function<Status()>> ops = std::move(step_ops_);
  step_ops_.clear();
  if (!status_.ok() || ops.empty()) return;
  const uint64_t hash = step_hash_;
  for (StepGraph& g : graphs_) {
    if (g.hash != hash) continue;
    g.last_use = ++graph_clock_;
    const cudaError_t e = cudaGraphLaunch(g.exec, stream_);
    if (e != cudaSuccess) fail(cuda::cuda_status(e, "replay a decode step's CUDA graph"));
    ++graph_stats_.replays;
    return;
  }
  // Capture a step seen twice in a row: the first ran op by op and grew
  // every scratch buffer it needs, so the capture allocates nothing.
  if (hash == last_eager_hash_ && capture_step(ops, hash)) return;
  last_eager_hash_ = hash;
  for (auto& op : ops) {
    const Status st = op();
    if (!st.ok()) {
      fail(st);
      return;
    }
  }
}

bool CudaBackend::capture_step(const std::vector<std::function<Status()>>& ops, uint64_t hash) {
  if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
    (void)cudaGetLastError();
    ++graph_stats_.capture_failures;
    return false;
  }
  Status st;
  for (const auto& op : ops) {
    st = op();
    if (!st.ok()) break;
  }
  // A copy the step forked onto copy_stream_ and no launch waited for
  // (attention_mapped's read-ahead) joins the stream before the capture ends.
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (st.ok() && copy_stream_ && cudaStreamIsCapturing(copy_stream_, &cs) == cudaSuccess &&
      cs == cudaStreamCaptureStatusActive) {
    if ((!copy_join_ &&
         cudaEventCreateWithFlags(&copy_join_, cudaEventDisableTiming) != cudaSuccess) ||
        cudaEventRecord(copy_join_, copy_stream_) != cudaSuccess ||
        cudaStreamWaitEvent(stream_, copy_join_, 0) != cudaSuccess)
      st = make_error(ErrorCode::kInternal, "CUDA: join the KV tier's copies into the step");
  }
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(stream_, &graph);
  cudaGraphExec_t exec = nullptr;
  if (st.ok() && e == cudaSuccess && graph) e = cudaGraphInstantiate(&exec, graph, 0);
  if (graph) (void)cudaGraphDestroy(graph);
  if (!st.ok() || e != cudaSuccess || !exec) {
    // Nothing ran: the launches were recorded, not executed. The caller runs them.
    if (exec) (void)cudaGraphExecDestroy(exec);
    (void)cudaGetLastError();
    ++graph_stats_.capture_failures;
    last_eager_hash_ = 0;
    return false;
  }
  e = cudaGraphLaunch(exec, stream_);
  if (e != cudaSuccess) {
    (void)cudaGraphExecDestroy(exec);
    (void)cudaGetLastError();
    ++graph_stats_.capture_failures;
    return false;
  }
  if (graphs_.size() >= kMaxGraphs) {
    size_t oldest = 0;
    for (size_t i = 1; i < graphs_.size(); ++i)
      if (graphs_[i].last_use < graphs_[oldest].last_use) oldest = i;
    (void)cudaStreamSynchronize(stream_);  // it may still be running
    (void)cudaGraphExecDestroy(graphs_[oldest].exec);
    graphs_.erase(graphs_.begin() + static_cast<std::ptrdiff_t>(oldest));
  }
  graphs_.push_back(StepGraph{hash, ++graph_clock_, exec});
  ++graph_stats_.captures;
  return true;
}

void CudaBackend::drop_graphs() {
  if (!graphs_.empty()) (void)cudaStreamSynchronize(stream_);
  for (StepGraph& g : graphs_) (void)cudaGraphExecDestroy(g.exec);
  graphs_.clear();
  last_eager_hash_ = 0;
}

}  // namespace loom
