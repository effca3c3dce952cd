#include "app/live_stats.h"

namespace {
// One tokens/s point per quarter second or per 32 tokens, whichever comes
// first (a fast model still draws a line within one short reply); at most
// this many kept, the oldest dropped first.
constexpr double kWindowSeconds = 0.25;
constexpr uint64_t kWindowTokens = 32;
constexpr size_t kMaxPoints = 4800;
constexpr size_t kMaxMarks = 256;
}  // namespace

LiveStats::LiveStats() : m_profiler(std::make_shared<loom::Profiler>(0)) {}

double LiveStats::generationSeconds(Clock::time_point t) const {
  return m_generationBase +
         (m_generating ? std::chrono::duration<double>(t - m_generationStart).count() : 0.0);
}

std::shared_ptr<loom::Profiler> LiveStats::resetForModel(int64_t nLayer) {
  auto profiler = std::make_shared<loom::Profiler>(nLayer);
  m_itl.reset();
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_profiler = profiler;
    m_tps.clear();
    m_marks.clear();
    m_generationBase = 0;
    m_lastTtftMs = m_lastTps = 0;
    m_tokensTotal = 0;
    m_generating = false;
  }
  bump();
  return profiler;
}

void LiveStats::resetTimings() {
  m_itl.reset();
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_profiler->reset();
  }
  bump();
}

void LiveStats::generationStarted() {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_generating = true;
  m_generationStart = Clock::now();
  m_windowStart = m_generationStart;
  m_windowTokens = 0;
  bump();
}

void LiveStats::tokenGenerated(uint64_t sincePreviousNs) {
  if (sincePreviousNs > 0) m_itl.record_ns(sincePreviousNs);
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(m_mutex);
  ++m_tokensTotal;
  if (sincePreviousNs == 0) {
    // The first token of a reply: decoding starts here (the prompt's time is TTFT, not tokens/s).
    m_windowStart = now;
    m_windowTokens = 0;
    m_pointsThisReply = 0;
  } else {
    ++m_windowTokens;
  }
  const double dt = std::chrono::duration<double>(now - m_windowStart).count();
  if (dt >= kWindowSeconds || (m_windowTokens >= kWindowTokens && dt > 0)) {
    if (m_tps.size() >= kMaxPoints)
      m_tps.erase(m_tps.begin(), m_tps.begin() + static_cast<long>(kMaxPoints / 4));
    m_tps.emplace_back(generationSeconds(now), static_cast<double>(m_windowTokens) / dt);
    ++m_pointsThisReply;
    m_windowStart = now;
    m_windowTokens = 0;
  }
  bump();
}

void LiveStats::placementChanged(std::string what) {
  std::lock_guard<std::mutex> lock(m_mutex);
  if (m_marks.size() >= kMaxMarks)
    m_marks.erase(m_marks.begin(), m_marks.begin() + static_cast<long>(kMaxMarks / 4));
  m_marks.emplace_back(generationSeconds(Clock::now()), std::move(what));
  bump();
}

void LiveStats::generationFinished(double ttftMs, double tokensPerSecond) {
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(m_mutex);
  // The last partial window: kept when it is long enough to mean something,
  // or when it is all a short reply has (then it spans the whole reply).
  const double dt = std::chrono::duration<double>(now - m_windowStart).count();
  if (m_windowTokens > 0 && dt > 0 &&
      (dt >= kWindowSeconds / 2 || m_windowTokens >= kWindowTokens / 2 || m_pointsThisReply == 0)) {
    m_tps.emplace_back(generationSeconds(now), static_cast<double>(m_windowTokens) / dt);
  }
  m_windowTokens = 0;
  m_generationBase = generationSeconds(now);
  m_generating = false;
  m_lastTtftMs = ttftMs;
  m_lastTps = tokensPerSecond;
  bump();
}

void LiveStats::setMemory(const TierBytes& gpu, const TierBytes& ram, const TierBytes& ssd,
                          bool gpuPresent, bool ssdPresent, std::vector<KvLayerBytes> kvLayers) {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_kvLayers = std::move(kvLayers);
  m_gpu = gpu;
  m_ram = ram;
  m_ssd = ssd;
  m_gpuPresent = gpuPresent;
  m_ssdPresent = ssdPresent;
  bump();
}

LiveSnapshot LiveStats::snapshot() const {
  LiveSnapshot s;
  s.version = version();
  s.itl = m_itl.snapshot();
  std::shared_ptr<loom::Profiler> profiler;
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    profiler = m_profiler;
    s.tokensPerSecond = m_tps;
    s.placementMarks = m_marks;
    s.gpu = m_gpu;
    s.ram = m_ram;
    s.ssd = m_ssd;
    s.gpuPresent = m_gpuPresent;
    s.ssdPresent = m_ssdPresent;
    s.kvLayers = m_kvLayers;
    s.lastTtftMs = m_lastTtftMs;
    s.lastTokensPerSecond = m_lastTps;
    s.tokensTotal = m_tokensTotal;
    s.generating = m_generating;
  }
  // Lock-free reads, outside the mutex.
  const loom::Profiler::Snapshot p = profiler->snapshot();
  s.layers.reserve(p.layers.size());
  for (const auto& l : p.layers) s.layers.push_back(l[loom::Profiler::kLayerTotal]);
  s.embed = p.embed;
  s.output = p.output;
  s.step = p.step;
  return s;
}
