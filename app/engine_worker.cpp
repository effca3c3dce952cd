#include "app/engine_worker.h"

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLocale>
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "app/engine_bridge.h"
#include "app/live_stats.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/backends/cuda/cuda.h"
#include "engine/backends/vulkan/vulkan.h"
#include "engine/model/discovery.h"
#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/placement/adaptive.h"
#include "engine/placement/cost_model.h"
#include "engine/placement/placement.h"
#include "engine/placement/strategy.h"
#include "engine/profile/profiler.h"
#include "engine/runtime/probe.h"
#include "engine/runtime/session.h"
#include "engine/runtime/verify.h"
#include "storage/store.h"

namespace {

using Clock = std::chrono::steady_clock;

QString qstr(const std::string& s) {
  return QString::fromStdString(s);
}

int defaultThreads(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Below this size a matmul is a few microseconds of work: handing pieces of it
// to other threads costs more than it saves (and a busy machine can keep a
// helper thread waiting for milliseconds), so tiny models run on one thread.
constexpr uint64_t kTinyModelBytes = 32ull << 20;

// Which Vulkan device to open: a discrete GPU first, a software renderer last.
int deviceRank(const loom::VulkanDeviceInfo& d) {
  if (d.type == "discrete") return 0;
  if (d.type == "integrated") return 1;
  if (d.type == "virtual") return 2;
  if (d.type == "cpu") return 3;
  return 4;
}

}  // namespace

EngineWorker::EngineWorker(QString dbPath, int nThreads, std::shared_ptr<LiveStats> stats)
    : m_dbPath(std::move(dbPath)),
      m_threadsAsked(nThreads),
      m_nThreads(defaultThreads(nThreads)),
      m_stats(std::move(stats)) {}

// The session refers to the model and the backends: it goes first.
EngineWorker::~EngineWorker() {
  m_session.reset();
  m_adaptive.reset();
  m_planner.reset();
  m_model.reset();
  m_gpu.reset();
  m_cpu.reset();
}

void EngineWorker::openStore() {
  if (m_store || m_dbPath.isEmpty()) return;
  auto s = loom::storage::Store::open(m_dbPath.toStdString());
  if (!s.ok()) {
    emit warning(tr("Replies cannot be saved while they stream: %1").arg(qstr(s.message())));
    return;
  }
  m_store = std::move(s).value();
}

// ---- devices ------------------------------------------------------------------

// CUDA first (NVIDIA's own path), when built and a usable device is there.
bool EngineWorker::openCuda(QString* whyNot) {
  if (!loom::cuda_built()) {
    *whyNot = tr("CUDA: not built");
    return false;
  }
  auto list = loom::list_cuda_devices();
  if (!list.ok()) {
    *whyNot = tr("CUDA: %1").arg(qstr(list.message()));
    return false;
  }
  const loom::CudaDeviceInfo* best = nullptr;
  for (const loom::CudaDeviceInfo& d : *list) {
    if (d.usable && (!best || d.total_bytes > best->total_bytes)) best = &d;
  }
  if (!best) {
    *whyNot = list->empty() ? tr("CUDA: no device found") : tr("CUDA: no usable device");
    return false;
  }
  loom::CudaOptions co;
  co.device = best->index;
  auto cb = loom::create_cuda_backend(co);
  if (!cb.ok()) {
    *whyNot = tr("CUDA: %1 could not be opened: %2").arg(qstr(best->name), qstr(cb.message()));
    return false;
  }
  m_gpu = std::move(cb).value();
  m_gpuId = QStringLiteral("cuda:%1").arg(best->index);
  m_gpuName = qstr(best->name);
  m_gpuType = QStringLiteral("discrete");
  m_gpuMemory = static_cast<qint64>(best->total_bytes);
  return true;
}

void EngineWorker::ensureGpu() {
  if (m_gpuTried) return;
  m_gpuTried = true;
  QString cudaWhyNot;
  if (openCuda(&cudaWhyNot)) return;
  ensureVulkan();
  // Neither: say why for both (CUDA's reason only where it was built).
  if (!m_gpu && loom::cuda_built()) m_gpuWhyNot = cudaWhyNot + QStringLiteral("; ") + m_gpuWhyNot;
}

void EngineWorker::ensureVulkan() {
  if (!loom::vulkan_built()) {
    m_gpuWhyNot = tr("Vulkan: not built");
    return;
  }
  auto list = loom::list_vulkan_devices();
  if (!list.ok()) {
    const QString why = qstr(list.message());
    m_gpuWhyNot = why.startsWith(QLatin1String("Vulkan")) ? why : tr("Vulkan: %1").arg(why);
    return;
  }
  const loom::VulkanDeviceInfo* best = nullptr;
  QStringList unusable;
  for (const loom::VulkanDeviceInfo& d : *list) {
    if (!d.usable) {
      unusable << QStringLiteral("%1: %2").arg(qstr(d.name), qstr(d.why_not));
      continue;
    }
    if (!best || deviceRank(d) < deviceRank(*best)) best = &d;
  }
  if (!best) {
    m_gpuWhyNot =
        list->empty()
            ? tr("Vulkan: no device found")
            : tr("Vulkan: no usable device (%1)").arg(unusable.join(QStringLiteral("; ")));
    return;
  }
  loom::VulkanOptions vo;
  vo.device = best->index;
  auto vb = loom::create_vulkan_backend(vo);
  if (!vb.ok()) {
    m_gpuWhyNot =
        tr("Vulkan: %1 could not be opened: %2").arg(qstr(best->name), qstr(vb.message()));
    return;
  }
  m_gpu = std::move(vb).value();
  m_gpuId = QStringLiteral("vulkan:%1").arg(best->index);
  m_gpuName = qstr(best->name);
  m_gpuType = qstr(best->type);
  m_gpuMemory = static_cast<qint64>(best->device_local_bytes);
}

namespace {
// What a session's KV may use, in words: "RAM up to 2.0 GiB, then the SSD (folder)".
QString tiersText(const loom::KvTierConfig& t) {
  const QString gpu =
      t.device_budget > 0
          ? EngineWorker::tr("KV cache on the GPU up to %1; ")
                .arg(QLocale::system().formattedDataSize(static_cast<qint64>(t.device_budget), 1,
                                                         QLocale::DataSizeTraditionalFormat))
          : QString();
  if (t.ram_budget == 0)
    return gpu + EngineWorker::tr("KV cache: host RAM without a limit (no SSD spill)");
  QString s =
      gpu +
      EngineWorker::tr("KV cache: RAM up to %1, then the SSD in %2 (%3 blocks spill first%4)")
          .arg(QLocale::system().formattedDataSize(static_cast<qint64>(t.ram_budget), 1,
                                                   QLocale::DataSizeTraditionalFormat),
               QString::fromStdString(t.spill_dir),
               t.policy == "lru" ? EngineWorker::tr("least recently used")
                                 : EngineWorker::tr("least attended"),
               t.spill_type.empty()
                   ? QString()
                   : EngineWorker::tr("; %1 on the SSD").arg(QString::fromStdString(t.spill_type)));
  return s;
}
}  // namespace

void EngineWorker::discoverModels() {
  QVector<FoundModelInfo> out;
  for (const loom::FoundModel& m :
       loom::discover_models(loom::DiscoveryOptions::from_environment())) {
    FoundModelInfo f;
    f.path = qstr(m.path);
    f.name = qstr(m.name);
    f.arch = qstr(m.arch);
    f.quant = qstr(m.quant);
    f.sizeBytes = static_cast<qint64>(m.size_bytes);
    f.source = qstr(m.source);
    f.error = qstr(m.error);
    out.push_back(f);
  }
  emit modelsFound(out);
}

void EngineWorker::setKvTiers(quint64 requestId, const KvTierSettings& tiers) {
  const KvTierSettings old = m_kvTiers;
  m_kvTiers = tiers;
  if (!m_model || !m_session) {
    emit kvTiersApplied(requestId, true, tr("Used from the next model loaded."));
    return;
  }
  QString error;
  if (!rebuildSession(m_sessionCtx, m_kvDtype, nullptr, &error, &old)) {
    emit kvTiersApplied(requestId, false, error);
    return;
  }
  publishMemory();
  emit kvTiersApplied(requestId, true, tiersText(m_session->kv().tier_config()));
}

void EngineWorker::probeDevices() {
  ensureGpu();
  QVector<DeviceInfo> devices = detectDevices(m_nThreads, /*probeGpus=*/true);
  for (DeviceInfo& d : devices) {
    if (d.kind != QLatin1String("Vulkan")) continue;
    if (m_gpu && d.backendId == m_gpuId) {
      d.inUse = true;
      d.status = tr("in use");
      d.memTotal = m_gpuMemory;
      d.details << tr("Runs the cells placed on the GPU; the CPU runs the others.");
      if (m_gpuType == QLatin1String("cpu")) {
        d.details << tr(
            "A software renderer (the CPU emulating a GPU): correct, but slower than the CPU "
            "itself.");
      }
    } else if (d.present && m_gpu) {
      d.status = tr("not used");
      d.details << tr("Loom runs on one GPU at a time: %1.").arg(m_gpuName);
    } else if (d.present) {
      d.status = tr("could not be opened");
      d.details << m_gpuWhyNot;
    }
  }
  m_devices = devices;
  emit devicesFound(devices);
}

// ---- models -------------------------------------------------------------------

void EngineWorker::loadDemoModel(quint64 requestId, const QString& path) {
  if (!QFileInfo::exists(path)) {
    QDir().mkpath(QFileInfo(path).absolutePath());
    loom::SynthSpec spec;
    const DemoModelSpec demo;
    if (loom::Status st = loom::apply_synth_preset(demo.preset.toStdString(), &spec); !st.ok()) {
      emit modelLoadFailed(requestId, qstr(st.message()));
      return;
    }
    spec.weight_type = demo.weightType.toStdString();
    spec.seed = demo.seed;
    // Written next to its final name and renamed, so a half-written file is never "the demo model".
    const QString part = path + QStringLiteral(".part");
    const QString stage = tr("Writing the demo model (random weights)…");
    emit loadProgress(requestId, stage, 0);
    int lastPercent = 0;
    auto report =
        loom::write_synthetic_model(spec, part.toStdString(), [&](uint64_t done, uint64_t total) {
          const int pct = total ? static_cast<int>(done * 100 / total) : 0;
          if (pct != lastPercent) emit loadProgress(requestId, stage, lastPercent = pct);
        });
    if (!report.ok()) {
      QFile::remove(part);
      emit modelLoadFailed(requestId, qstr(report.message()));
      return;
    }
    QFile::remove(path);
    if (!QFile::rename(part, path)) {
      emit modelLoadFailed(requestId,
                           tr("Could not move the demo model into place at %1").arg(path));
      return;
    }
  }
  loadModel(requestId, path, /*isDemo=*/true);
}

void EngineWorker::loadModel(quint64 requestId, const QString& path, bool isDemo) {
  // Stages: reading the file (one engine call: no progress inside it), measuring
  // the units for the cost model, then placing the weights (uploads and
  // re-quantization, one call too). Cancel is honoured between stages.
  const QString file = QFileInfo(path).fileName();
  emit loadProgress(requestId, tr("Reading %1… (step 1 of 3)").arg(file), -1);
  auto loaded = loom::load_model(path.toStdString());
  if (loadCancelled(requestId)) {
    emit modelLoadCancelled(requestId);
    return;
  }
  if (!loaded.ok()) {
    emit modelLoadFailed(requestId, qstr(loaded.message()));
    return;
  }
  std::shared_ptr<loom::Model> model = std::move(loaded).value();
  // What runs now, to be put back if this load does not go through.
  const bool hadSession = m_session != nullptr;
  const loom::Placement oldPlacement =
      hadSession ? m_session->forward().placement() : loom::Placement::uniform(0, loom::Unit::kCpu);
  const QString oldKv = m_kvDtype;
  const int oldCtx = m_sessionCtx;
  ensureGpu();
  const int threads = m_threadsAsked > 0                        ? m_threadsAsked
                      : model->weight_bytes() < kTinyModelBytes ? 1
                                                                : m_nThreads;
  if (!m_cpu || m_cpu->n_threads() != threads) {
    // Measuring needs the backend the model will run on; a session on the old
    // one is rebuilt below if this load does not go through.
    dropSession();
    m_cpu = std::make_unique<loom::CpuBackend>(threads);
  }

  emit loadProgress(requestId,
                    m_gpu ? tr("Measuring the CPU and the GPU for the cost model… (step 2 of 3)")
                          : tr("Measuring the CPU for the cost model… (step 2 of 3)"),
                    33);
  loom::CostModel cost = loom::CostModel::defaults();
  QStringList notes;
  if (auto c = loom::calibrate(*model, *m_cpu, m_gpu.get()); c.ok()) {
    cost = *c;
  } else {
    notes << tr("The cost model could not measure this machine (%1); its predictions use rough "
                "defaults.")
                 .arg(qstr(c.message()));
  }
  if (loadCancelled(requestId)) {
    emit modelLoadCancelled(requestId);
    return;
  }
  if (!m_gpu) notes << tr("CPU only: %1.").arg(m_gpuWhyNot);

  ModelSummary summary = summarizeModel(*model, path, isDemo);
  auto planner = std::make_shared<PlacementPlanner>(model, summary, cost,
                                                    m_gpu ? m_gpuId : QString(), m_gpuMemory);
  // The first placement: the cost model's best under the whole device memory
  // on a real GPU; on a software renderer (or none) the CPU, with the GPU one
  // click away in the grid.
  loom::StrategyOptions so;
  so.has_gpu = m_gpu != nullptr;
  so.strategy =
      !m_gpu || m_gpuType == QLatin1String("cpu") ? "cpu" : (cost.measured ? "auto" : "gpu");
  so.vram_budget = static_cast<uint64_t>(m_gpuMemory);
  so.n_ctx = std::min<int64_t>(model->hp.n_ctx_train, 4096);
  so.max_chunk = planner->prefillChunk();
  loom::Placement first = loom::Placement::uniform(model->hp.n_layer, loom::Unit::kCpu);
  if (auto p = loom::make_placement(*model, so, cost); p.ok()) first = *p;
  if (m_gpu && m_gpuType == QLatin1String("cpu")) {
    notes << tr("The GPU is %1, a software renderer: the placement starts on the CPU.")
                 .arg(m_gpuName);
  }

  const QString stage3 = first.uses(loom::Unit::kGpu)
                             ? tr("Uploading weights to the GPU… (step 3 of 3)")
                             : tr("Preparing the weights… (step 3 of 3)");
  emit loadProgress(requestId, stage3, 66);
  // Re-quantization and uploads report per layer, and stop when the load is cancelled.
  int lastPercent = 66;
  auto progress = [&](double done) {
    const int pct = 66 + static_cast<int>(done * 33.0);
    if (pct != lastPercent) emit loadProgress(requestId, stage3, lastPercent = pct);
    return !loadCancelled(requestId);
  };
  // The old session goes first (the GPU holds one model's weights at a time);
  // if the new one fails, the old model gets its session back.
  dropSession();
  auto restoreOld = [&] {
    if (m_gpu) m_gpu->release_weights();
    if (!m_model) return;
    QString ignored;
    auto back = makeSession(
        *m_model, oldCtx, oldKv,
        hadSession ? oldPlacement : loom::Placement::uniform(m_model->hp.n_layer, loom::Unit::kCpu),
        &ignored);
    if (!back)
      back = makeSession(*m_model, oldCtx, oldKv,
                         loom::Placement::uniform(m_model->hp.n_layer, loom::Unit::kCpu), &ignored);
    if (back) setSession(std::move(back), oldKv, oldCtx);
  };
  QString error;
  auto session = makeSession(*model, 0, QStringLiteral("F16"), first, &error, progress);
  if (!session || loadCancelled(requestId)) {
    session.reset();
    restoreOld();
    if (loadCancelled(requestId))
      emit modelLoadCancelled(requestId);
    else
      emit modelLoadFailed(requestId, error);
    return;
  }

  // A placement asked for on the old model does not apply to this one.
  std::optional<Wanted> stale;
  {
    std::lock_guard<std::mutex> lock(m_mu);
    stale.swap(m_wanted);
    m_planner = planner;
  }
  if (stale)
    emit placementFailed(stale->requestId,
                         tr("Another model was loaded before the placement was applied."));
  attachAdaptive(nullptr, 0);  // it measured the old model
  m_model = std::move(model);
  m_profiler = m_stats->resetForModel(m_model->hp.n_layer);
  setSession(std::move(session), QStringLiteral("F16"), 0);
  // On a real GPU, auto's first placement is where the adaptive auto starts.
  if (so.strategy == "auto") {
    PlacementPlan start = currentPlan();
    start.strategy = QStringLiteral("adaptive");
    start.vramBudgetMiB = static_cast<int>(m_gpuMemory >> 20);
    attachAdaptive(m_planner->makeAdaptive(start), start.vramBudgetMiB);
  }
  m_summary = summary;
  m_summary.nCtx = static_cast<int>(m_session->n_ctx());
  m_summary.kvDtype = m_kvDtype;
  publishMemory();

  openStore();
  if (m_store) {
    loom::storage::RecentModel rm;
    rm.path = path.toStdString();
    rm.name = m_summary.name.toStdString();
    rm.description = m_summary.description.toStdString();
    rm.size_bytes = m_summary.fileBytes;
    (void)m_store->touch_recent_model(rm);  // a list for convenience: not worth failing a load over
  }
  const QString note =
      placementNote() +
      (notes.isEmpty() ? QString() : QStringLiteral("\n") + notes.join(QStringLiteral("\n")));
  m_remote.reset();  // a local model is the source again
  emit modelLoaded(requestId, m_summary, currentPlan(), m_planner, note);
}

std::unique_ptr<loom::Session> EngineWorker::makeSession(const loom::Model& model, int nCtx,
                                                         const QString& kvDtype,
                                                         const loom::Placement& placement,
                                                         QString* error,
                                                         std::function<bool(double)> progress) {
  const auto dt = loom::dtype_from_name(kvDtype.toStdString());
  if (!dt) {
    *error = tr("Unknown KV cache precision %1").arg(kvDtype);
    return nullptr;
  }
  loom::SessionConfig sc;
  sc.n_ctx = nCtx;
  sc.kv_dtype = *dt;
  // Prompts in long chunks where the GPU runs part of the model (its GEMMs
  // and flash attention gain most on them), as `loom run` does.
  sc.max_chunk = loom::default_prefill_chunk(
      model, m_gpu && placement.uses(loom::Unit::kGpu) ? m_gpu->memory_capacity() : 0);
  // KV tiers: host RAM up to a budget, the rest in a spill file on the SSD.
  // The automatic budget is set only where the context's KV would not fit in
  // half the free memory (the same default as `loom run`).
  sc.kv_tiers.spill_dir = m_kvTiers.spillDir.isEmpty() ? loom::default_kv_spill_dir()
                                                       : m_kvTiers.spillDir.toStdString();
  sc.kv_tiers.policy = m_kvTiers.policy.toStdString();
  sc.kv_tiers.spill_type = m_kvTiers.spillType.toStdString();
  sc.kv_tiers.write_behind = true;
  if (m_kvTiers.ramBudgetMiB < 0) {
    const int64_t ctx = nCtx > 0 ? nCtx : std::min<int64_t>(model.hp.n_ctx_train, 4096);
    sc.kv_tiers.ram_budget = loom::default_kv_ram_budget(loom::kv_bytes_per_layer(model, ctx, *dt) *
                                                         static_cast<uint64_t>(model.hp.n_layer));
  } else {
    sc.kv_tiers.ram_budget = static_cast<uint64_t>(m_kvTiers.ramBudgetMiB) << 20;
  }
  // The device tier: GPU layers keep at most this much KV on the device.
  // Without a size, as much as fits beside the GPU's weights (all of it
  // when the whole context's KV fits; the same default as `loom run`).
  if (m_kvTiers.gpuBudgetMiB > 0) {
    sc.kv_tiers.device_budget = static_cast<uint64_t>(m_kvTiers.gpuBudgetMiB) << 20;
  } else if (m_gpu) {
    loom::StrategyOptions so;
    so.n_ctx = nCtx > 0 ? nCtx : std::min<int64_t>(model.hp.n_ctx_train, 4096);
    so.kv_dtype = *dt;
    so.max_chunk = sc.max_chunk;
    sc.kv_tiers.device_budget =
        loom::default_kv_device_budget(model, placement, so, m_gpu->memory_capacity());
  }
  // On the GPU backend when there is one: the CPU is then the other unit.
  loom::Backend& primary = m_gpu ? *m_gpu : static_cast<loom::Backend&>(*m_cpu);
  auto session = loom::Session::create(model, primary, sc);
  if (!session.ok()) {
    *error = qstr(session.message());
    return nullptr;
  }
  loom::ForwardPass& fwd = (*session)->forward();
  fwd.set_fallback(m_cpu.get());
  fwd.set_progress(std::move(progress));
  loom::Status st = fwd.set_placement(placement);
  if (st.ok()) st = fwd.prepare();
  fwd.set_progress(nullptr);
  if (!st.ok()) {
    *error = qstr(st.message());
    return nullptr;
  }
  return std::move(session).value();
}

void EngineWorker::setSession(std::unique_ptr<loom::Session> s, const QString& kvDtype,
                              int nCtxAsked) {
  std::optional<Wanted> again;
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_session = std::move(s);
    m_kvDtype = kvDtype;
    // A placement asked for on the session just replaced: ask this one.
    if (m_wanted && m_wanted->kvDtype == kvDtype) again = m_wanted;
  }
  m_sessionCtx = nCtxAsked;
  m_session->set_profiler(m_profiler.get());
  // Live re-placements report how far they are (they run on this thread, between two tokens).
  m_session->forward().set_progress([this](double done) {
    emit placementProgress(static_cast<int>(done * 100.0));
    return true;
  });
  m_summary.nCtx = static_cast<int>(m_session->n_ctx());
  m_summary.kvDtype = kvDtype;
  // A new session for the same model (new KV cache): the adaptive auto goes on there.
  if (m_adaptive && &m_adaptive->model() == &m_session->model())
    attachAdaptive(m_adaptive, m_adaptiveBudgetMiB);
  if (again) {
    const quint64 id = again->requestId;
    m_session->request_placement(*again->placement, [this, id](const loom::Status& st) {
      onPlacementDone(id, st.ok(), st.ok() ? QString() : qstr(st.message()));
    });
    QMetaObject::invokeMethod(
        this, [this] { applyPendingPlacement(); }, Qt::QueuedConnection);
  }
}

void EngineWorker::dropSession() {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_session.reset();
  }
  // Nothing else uses the GPU: every copy it holds was this session's.
  if (m_gpu) m_gpu->release_weights();
}

bool EngineWorker::rebuildSession(int nCtx, const QString& kvDtype,
                                  const loom::Placement* placement, QString* error,
                                  const KvTierSettings* oldTiers) {
  if (!m_model) {
    *error = tr("No model is loaded.");
    return false;
  }
  const loom::Placement old = m_session
                                  ? m_session->forward().placement()
                                  : loom::Placement::uniform(m_model->hp.n_layer, loom::Unit::kCpu);
  const QString oldKv = m_kvDtype;
  const int oldCtx = m_sessionCtx;
  dropSession();
  auto progress = [this](double done) {
    emit placementProgress(static_cast<int>(done * 100.0));
    return true;
  };
  if (auto s =
          makeSession(*m_model, nCtx, kvDtype, placement ? *placement : old, error, progress)) {
    setSession(std::move(s), kvDtype, nCtx);
    return true;
  }
  // Back to what there was, so the model stays usable (the chat lives in the store).
  if (oldTiers) m_kvTiers = *oldTiers;
  if (m_gpu) m_gpu->release_weights();
  QString ignored;
  auto back = makeSession(*m_model, oldCtx, oldKv, old, &ignored);
  if (!back) {
    if (m_gpu) m_gpu->release_weights();
    back = makeSession(*m_model, oldCtx, oldKv,
                       loom::Placement::uniform(m_model->hp.n_layer, loom::Unit::kCpu), &ignored);
  }
  if (back) setSession(std::move(back), oldKv, oldCtx);
  return false;
}

PlacementPlan EngineWorker::currentPlan() const {
  if (!m_session || !m_planner) return {};
  PlacementPlan plan = m_planner->toPlan(m_session->forward().placement(), m_kvDtype,
                                         static_cast<int>(m_session->n_ctx()));
  if (m_adaptive && m_session->adaptive() == m_adaptive.get()) {
    plan.strategy = QStringLiteral("adaptive");
    plan.vramBudgetMiB = m_adaptiveBudgetMiB;
  }
  return plan;
}

void EngineWorker::setAdaptivePaused(bool paused) {
  std::lock_guard<std::mutex> lock(m_mu);
  m_adaptivePaused = paused;
  if (m_adaptive) m_adaptive->set_paused(paused);
}

void EngineWorker::attachAdaptive(std::shared_ptr<loom::AdaptiveController> c, int vramBudgetMiB) {
  if (m_session && m_session->adaptive() && m_session->adaptive() != c.get())
    m_session->set_adaptive(nullptr);
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_adaptive = std::move(c);
    if (m_adaptive) m_adaptive->set_paused(m_adaptivePaused);
  }
  m_adaptiveBudgetMiB = vramBudgetMiB;
  if (!m_adaptive || !m_session) return;
  m_adaptive->set_listener([this](const loom::AdaptiveEvent& e) { onAdaptiveEvent(e); });
  m_adaptive->start(m_session->forward().placement());
  m_session->set_adaptive(m_adaptive.get());
}

void EngineWorker::onAdaptiveEvent(const loom::AdaptiveEvent& e) {
  const std::string line = loom::adaptive_event_text(e);
  qInfo("loom: auto (adaptive): %s", line.c_str());
  if (e.kind == loom::AdaptiveEvent::Kind::kMeasured) return;
  const bool moved = e.kind != loom::AdaptiveEvent::Kind::kFailed &&
                     !e.placement.same_as(m_session->forward().placement());
  if (!moved && e.kind != loom::AdaptiveEvent::Kind::kFailed) return;  // kept where it was
  if (m_stats)
    m_stats->placementChanged(std::string("auto: ") + loom::adaptive_event_name(e.kind) + " " +
                              e.label);
  // What runs from the next token on: the event's placement (applied right
  // after this), or, when it failed, the one in force.
  PlacementPlan plan =
      moved ? m_planner->toPlan(e.placement, m_kvDtype, static_cast<int>(m_session->n_ctx()))
            : currentPlan();
  plan.strategy = QStringLiteral("adaptive");
  plan.vramBudgetMiB = m_adaptiveBudgetMiB;
  emit placementAdapted(plan, QString::fromStdString(line), moved);
}

QString EngineWorker::placementNote() const {
  if (!m_session || !m_model) return {};
  const loom::Placement& p = m_session->forward().placement();
  int onGpu = 0, total = 0;
  auto count = [&](const loom::GroupPlace& g) {
    ++total;
    if (g.unit == loom::Unit::kGpu) ++onGpu;
  };
  count(p.embed);
  count(p.output);
  for (const auto& l : p.layers) {
    for (const auto& g : l.g) count(g);
  }
  QString note = onGpu == 0 ? tr("Everything runs on the CPU.")
                 : onGpu == total
                     ? tr("Everything runs on the GPU: %1.").arg(m_gpuName)
                     : tr("%1 of %2 op groups run on the GPU (%3), the rest on the CPU.")
                           .arg(onGpu)
                           .arg(total)
                           .arg(m_gpuName.section(QStringLiteral(" ("), 0, 0));
  note += tr(" KV cache %1.").arg(m_kvDtype);
  const auto& fell = m_session->forward().notes();
  if (!fell.empty()) {
    note += tr("\nFell back to the CPU:");
    for (const std::string& n : fell) note += QStringLiteral("\n· ") + qstr(n);
  }
  return note;
}

void EngineWorker::publishMemory() {
  TierBytes gpu, ram, ssd;
  bool ssdPresent = false;
  std::vector<KvLayerBytes> kvLayers;
  if (m_model && m_session) {
    // Weights as the placement holds them (re-quantized sizes); host weights
    // are memory-mapped or re-quantized copies, resident once read.
    const loom::PlacementBytes b =
        loom::placement_bytes(*m_model, m_session->forward().placement(), 0);
    gpu.weights = b.weights[static_cast<size_t>(loom::Unit::kGpu)];
    ram.weights = b.weights[static_cast<size_t>(loom::Unit::kCpu)];
    const loom::KvTierStats t = m_session->kv().tier_stats();
    gpu.kv = t.device_bytes;
    ram.kv = t.ram_bytes + t.staging_bytes;
    ssd.kv = t.ssd_bytes;
    ssdPresent = m_session->kv().tiered();
    if (ssdPresent) {  // the grid's per-layer view (PlacementModel::setKvLayers)
      for (const loom::KvLayerTiers& l : m_session->kv().layer_tiers())
        kvLayers.push_back(KvLayerBytes{l.device, l.ram, l.ssd});
    }
  }
  m_stats->setMemory(gpu, ram, ssd, /*gpuPresent=*/m_gpu != nullptr, ssdPresent,
                     std::move(kvLayers));
}

// ---- placement ------------------------------------------------------------------

void EngineWorker::checkPrecision(quint64 requestId, const PlacementPlan& plan) {
  // The text of `loom verify` and `loom probe`: short, so the double reference stays quick.
  static const char* kText =
      "Once upon a time, in a small town by the sea, there lived an old clockmaker who";
  if (!m_model || !m_cpu || !m_planner) {
    emit precisionCheckFailed(requestId, tr("No model is loaded."));
    return;
  }
  QString error;
  if (plan.rows.size() != m_planner->layerCount() + 2 || !m_planner->check(plan, &error)) {
    emit precisionCheckFailed(requestId,
                              error.isEmpty() ? tr("This placement is for another model.") : error);
    return;
  }
  std::vector<int32_t> tokens = m_model->tokenizer->encode(kText, /*add_special=*/true, false);
  if (tokens.size() > 32) tokens.resize(32);
  if (tokens.empty()) {
    emit precisionCheckFailed(requestId, tr("The check's text gives no tokens."));
    return;
  }
  auto cancelled = [this](int64_t) { return !m_shutdown.load(); };
  const loom::Placement p = m_planner->toPlacement(plan);
  auto v = loom::verify_placement(*m_model, *m_cpu, m_gpu.get(), p, tokens, cancelled);
  if (!v.ok()) {
    emit precisionCheckFailed(requestId, qstr(v.message()));
    return;
  }
  auto pr = loom::probe_model(*m_model, tokens, cancelled);
  if (!pr.ok()) {
    emit precisionCheckFailed(requestId, qstr(pr.message()));
    return;
  }
  PrecisionCheck c;
  c.rows = plan.rows;
  c.nTokens = static_cast<int>(tokens.size());
  const int n = static_cast<int>(plan.rows.size());
  c.error.fill(-1.0, n);
  c.outliers.fill(-1.0, n);
  c.outliersOut.fill(-1.0, n);
  c.outliersOut[0] = pr->embd.outlier_share;         // the embedding row: its output only
  c.outliers[n - 1] = pr->final_norm.outlier_share;  // the output row: the lm_head's input
  for (const loom::VerifyRow& row : v->rows) c.error[static_cast<int>(row.layer) + 1] = row.all;
  for (const loom::ProbeRow& row : pr->rows) {
    const int r = static_cast<int>(row.layer) + 1;
    c.outliers[r] = std::max(row.attn_in.outlier_share, row.ffn_in.outlier_share);
    c.outliersOut[r] = row.out.outlier_share;
  }
  emit precisionChecked(requestId, c);
}

bool EngineWorker::requestPlacement(quint64 requestId, const PlacementPlan& plan, QString* error,
                                    bool* waitsForReply) {
  if (waitsForReply) *waitsForReply = false;
  std::lock_guard<std::mutex> lock(m_mu);
  if (!m_session || !m_planner) {
    *error = tr("No model is loaded.");
    return false;
  }
  if (plan.rows.size() != m_planner->layerCount() + 2) {
    *error = tr("This placement is for another model.");
    return false;
  }
  if (!m_planner->check(plan, error)) return false;
  Wanted w;
  w.requestId = requestId;
  w.placement = std::make_shared<loom::Placement>(m_planner->toPlacement(plan));
  w.kvDtype = plan.kvPrecision();
  w.adaptive = m_planner->makeAdaptive(plan);
  w.vramBudgetMiB = plan.vramBudgetMiB;
  m_wanted = w;
  if (w.kvDtype != m_kvDtype) {
    // A new KV precision is a new KV cache: after the reply that streams, if any.
    if (waitsForReply) *waitsForReply = m_generating.load();
    QMetaObject::invokeMethod(
        this, [this] { applyWithNewKv(); }, Qt::QueuedConnection);
    return true;
  }
  m_session->request_placement(*w.placement, [this, requestId](const loom::Status& st) {
    onPlacementDone(requestId, st.ok(), st.ok() ? QString() : qstr(st.message()));
  });
  // Idle: applied at once (while a reply streams, generate() applies it between two tokens first).
  QMetaObject::invokeMethod(
      this, [this] { applyPendingPlacement(); }, Qt::QueuedConnection);
  return true;
}

void EngineWorker::applyPendingPlacement() {
  if (m_session)
    (void)m_session->apply_pending_placement();  // the outcome goes through onPlacementDone
}

void EngineWorker::applyWithNewKv() {
  std::optional<Wanted> w;
  {
    std::lock_guard<std::mutex> lock(m_mu);
    if (!m_wanted || m_wanted->kvDtype == m_kvDtype)
      return;  // answered already, or asked on the session
    w.swap(m_wanted);
  }
  const int kept = m_session ? static_cast<int>(m_session->tokens().size()) : 0;
  const QString before = m_kvDtype;
  QString error;
  if (!rebuildSession(m_sessionCtx, w->kvDtype, w->placement.get(), &error)) {
    publishMemory();
    emit placementFailed(w->requestId,
                         tr("%1\nThe previous placement stays; the chat is kept.").arg(error));
    return;
  }
  attachAdaptive(w->adaptive, w->vramBudgetMiB);  // as onPlacementDone: asked for, or ended
  if (m_stats) m_stats->placementChanged(m_adaptive ? "Auto (adaptive) applied" : "applied");
  m_stats->resetTimings();
  publishMemory();
  const QString note =
      tr("KV cache now %1 (was %2): the chat is kept, and the next reply re-reads its %n token(s).",
         "", kept)
          .arg(w->kvDtype, before);
  emit placementApplied(w->requestId, currentPlan(), note + QStringLiteral("\n") + placementNote());
}

void EngineWorker::onPlacementDone(quint64 requestId, bool ok, const QString& error) {
  std::shared_ptr<loom::AdaptiveController> adaptive;
  int budgetMiB = 0;
  {
    std::lock_guard<std::mutex> lock(m_mu);
    if (m_wanted && m_wanted->requestId == requestId) {
      adaptive = m_wanted->adaptive;
      budgetMiB = m_wanted->vramBudgetMiB;
      m_wanted.reset();
    }
  }
  if (!ok) {
    emit placementFailed(requestId,
                         tr("%1\nThe previous placement stays; the chat is kept.").arg(error));
    return;
  }
  // The placement asked for is in force: the adaptive auto from here when it
  // was asked for; any other request ended it (Session::apply_pending_placement).
  attachAdaptive(std::move(adaptive), budgetMiB);
  if (m_stats) m_stats->placementChanged(m_adaptive ? "Auto (adaptive) applied" : "applied");
  m_stats->resetTimings();
  publishMemory();
  const QString when =
      m_generating.load() ? tr("Applied between two tokens of the reply. ") : QString();
  emit placementApplied(requestId, currentPlan(), when + placementNote());
}

// ---- generation -----------------------------------------------------------------

void EngineWorker::recordOrigin(const GenerationRequest& req) {
  if (!m_store || req.messageId <= 0) return;
  QJsonObject o;
  o[QStringLiteral("file")] = m_summary.path;
  o[QStringLiteral("quant")] = m_summary.quant;
  o[QStringLiteral("placement")] = placementNote().section(QLatin1Char('\n'), 0, 0);
  o[QStringLiteral("kv")] = m_kvDtype;
  o[QStringLiteral("ctx")] = static_cast<qint64>(m_session->n_ctx());
  const SamplingSettings& s = req.sampling;
  o[QStringLiteral("sampling")] = QJsonObject{{QStringLiteral("temperature"), s.temperature},
                                              {QStringLiteral("top_k"), s.topK},
                                              {QStringLiteral("top_p"), s.topP},
                                              {QStringLiteral("min_p"), s.minP},
                                              {QStringLiteral("repeat_penalty"), s.repeatPenalty},
                                              {QStringLiteral("seed"), s.seed},
                                              {QStringLiteral("max_tokens"), s.maxTokens}};
  const loom::Status st =
      m_store->set_message_origin(req.messageId, modelDisplayName(m_summary).toStdString(),
                                  QJsonDocument(o).toJson(QJsonDocument::Compact).toStdString());
  if (!st.ok() && st.error().code() != loom::ErrorCode::kInvalidArgument)
    emit warning(tr("Could not save what wrote the reply: %1").arg(qstr(st.message())));
}

QString modelDisplayName(const ModelSummary& m) {
  return m.isDemo ? EngineWorker::tr("Loom demo") : m.name;
}

void EngineWorker::saveReply(qint64 messageId, const std::string& text,
                             loom::storage::MessageState state, const std::string& meta) {
  if (!m_store || messageId <= 0) return;
  loom::Status st = m_store->update_message(messageId, text, state, meta);
  // kInvalidArgument: the row is gone (the user deleted the chat meanwhile): nothing to save to.
  if (!st.ok() && st.error().code() != loom::ErrorCode::kInvalidArgument)
    emit warning(tr("Could not save the reply: %1").arg(qstr(st.message())));
}

void EngineWorker::generate(const GenerationRequest& req) {
  openStore();
  if (m_remote) {
    generateRemote(req);
    return;
  }
  GenerationResult r;
  r.requestId = req.requestId;
  r.messageId = req.messageId;
  std::string text;

  auto save = [&](loom::storage::MessageState state, const std::string& meta) {
    saveReply(req.messageId, text, state, meta);
  };
  auto fail = [&](const QString& message) {
    r.error = message;
    r.text = QString::fromStdString(text);
    r.meta = tr("error: %1").arg(message);
    save(loom::storage::MessageState::kError, r.meta.toStdString());
    emit generationFinished(r);
  };

  if (!m_model || !m_session) return fail(tr("No model is loaded."));
  if (stopWanted(req.requestId)) {
    r.cancelled = true;
    r.stopReason = QString::fromLatin1(loom::stop_reason_text(loom::StopReason::kCancelled));
    r.meta = tr("stopped");
    save(loom::storage::MessageState::kStopped, r.meta.toStdString());
    emit generationFinished(r);
    return;
  }
  if (req.sampling.nCtx != m_sessionCtx) {
    QString err;
    if (!rebuildSession(req.sampling.nCtx, m_kvDtype, nullptr, &err)) return fail(err);
    m_stats->resetTimings();
  }

  std::vector<loom::ChatMessage> messages;
  for (const ChatTurn& t : req.turns)
    messages.push_back({t.role.toStdString(), t.content.toStdString()});
  auto prompt = m_session->tokenize_chat(messages);
  if (!prompt.ok()) return fail(qstr(prompt.message()));
  recordOrigin(req);

  loom::GenerateParams gp;
  gp.sampling = toSamplerParams(req.sampling);
  gp.max_tokens = req.sampling.maxTokens;
  // Bytes that are not UTF-8 show as \xNN rather than as U+FFFD marks.
  gp.escape_invalid_utf8 = true;

  // Pieces are gathered and sent (and saved) about once a frame: the GUI
  // redraws once per batch, not per token, and the store sees ~60 writes/s at most.
  auto lastFlush = Clock::now();
  auto lastToken = Clock::now();
  bool first = true;
  auto flush = [&] {
    save(loom::storage::MessageState::kStreaming, {});
    emit textUpdated(req.requestId, req.messageId, QString::fromStdString(text));
  };
  // Every token counts in tokens/s and the intervals, also one whose text
  // is not out yet (part of a UTF-8 character that spans tokens).
  gp.on_token = [&](int32_t) {
    const auto now = Clock::now();
    m_stats->tokenGenerated(
        first ? 0 : static_cast<uint64_t>(std::chrono::nanoseconds(now - lastToken).count()));
    first = false;
    lastToken = now;
  };
  auto onPiece = [&](std::string_view piece) {
    const auto now = Clock::now();
    text.append(piece);
    if (now - lastFlush >= std::chrono::milliseconds(kBatchMs)) {
      flush();
      lastFlush = now;
    }
    return !stopWanted(req.requestId);
  };

  m_stats->generationStarted();
  m_generating.store(true);
  // The engine checks m_cancelNow before every token: requestStop sets it for this
  // request (a stop asked before this line is seen by the check after it).
  m_generatingRequest.store(req.requestId);
  m_cancelNow.store(m_shutdown.load() || m_stopRequest.load() == req.requestId);
  auto stats = m_session->generate(*prompt, gp, onPiece, &m_cancelNow);
  m_generatingRequest.store(0);
  m_generating.store(false);
  if (!stats.ok()) {
    m_stats->generationFinished(0, 0);
    return fail(qstr(stats.message()));
  }
  const loom::GenerateStats& st = *stats;
  r.text = QString::fromStdString(text);
  r.cancelled = st.reason == loom::StopReason::kCancelled;
  r.stopReason = QString::fromLatin1(loom::stop_reason_text(st.reason));
  r.nPrompt = static_cast<int>(st.n_prompt);
  r.nReused = static_cast<int>(st.n_reused);
  r.nGenerated = static_cast<int>(st.n_generated);
  r.ttftMs = st.ttft_ms;
  r.tokensPerSecond =
      st.decode_ms > 0 && st.n_generated > 1 ? (st.n_generated - 1) * 1000.0 / st.decode_ms : 0.0;
  m_stats->generationFinished(r.ttftMs, r.tokensPerSecond);
  publishMemory();

  r.meta = tr("%1 tokens · %2 tok/s · first token %3 ms")
               .arg(r.nGenerated)
               .arg(r.tokensPerSecond, 0, 'f', 1)
               .arg(r.ttftMs, 0, 'f', 0);
  if (r.cancelled)
    r.meta += tr(" · stopped");
  else if (st.reason != loom::StopReason::kEndOfGeneration)
    r.meta += QStringLiteral(" · ") + r.stopReason;
  // What the KV tiers did to this reply: blocks the SSD could not give back
  // (recomputed: the text is unaffected), or a full spill disk.
  if (st.n_kv_recomputed > 0)
    r.meta += tr(" · %1 KV blocks recomputed (SSD read failed)").arg(st.n_kv_recomputed);
  if (!st.note.empty()) r.meta += QStringLiteral(" · ") + QString::fromStdString(st.note);
  save(r.cancelled ? loom::storage::MessageState::kStopped : loom::storage::MessageState::kComplete,
       r.meta.toStdString());
  emit textUpdated(req.requestId, req.messageId, r.text);
  emit generationFinished(r);
}
