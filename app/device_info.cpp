#include "app/device_info.h"

#include <QFile>
#include <QObject>
#include <QRegularExpression>
#include <QSet>
#include <QTextStream>

#include "app/engine_bridge.h"
#include "app/theme.h"
#include "cpu/matmul.h"
#include "engine/backends/cuda/cuda.h"
#include "engine/backends/vulkan/vulkan.h"

namespace {

// "key : value" lines of a /proc file, first occurrence of each key.
QString procValue(const QString& path, const QString& key) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly | QIODevice::Text)) return {};
  QTextStream in(&f);
  QString line;
  while (in.readLineInto(&line)) {
    const int colon = line.indexOf(QLatin1Char(':'));
    if (colon > 0 && line.left(colon).trimmed() == key) return line.mid(colon + 1).trimmed();
  }
  return {};
}

qint64 meminfoBytes(const QString& key) {
  // "MemTotal:       131900000 kB"
  const QString v = procValue(QStringLiteral("/proc/meminfo"), key);
  return v.section(QLatin1Char(' '), 0, 0).toLongLong() * 1024;
}

QString isaText(loom::cpu::Isa isa) {
  switch (isa) {
    case loom::cpu::Isa::kAvx512: return QStringLiteral("AVX-512");
    case loom::cpu::Isa::kAvx2: return QStringLiteral("AVX2");
    case loom::cpu::Isa::kScalar: return QStringLiteral("scalar");
  }
  return QStringLiteral("?");
}

DeviceInfo cpuDevice(int nThreads) {
  DeviceInfo d;
  d.kind = QStringLiteral("CPU");
  d.backendId = QStringLiteral("cpu");
  d.present = true;
  d.inUse = true;
  d.status = QObject::tr("in use");
  d.color = theme::kCpu;
  d.name = procValue(QStringLiteral("/proc/cpuinfo"), QStringLiteral("model name"));
  if (d.name.isEmpty()) d.name = QStringLiteral("CPU");
  const auto detected = loom::cpu::detected_isa();
  const auto active = loom::cpu::active_isa();
  d.details << QObject::tr("Kernels: %1%2")
                   .arg(isaText(active),
                        active == detected
                            ? QString()
                            : QObject::tr(" (CPU supports %1)").arg(isaText(detected)));
  // The features the kernels care about, as the kernel reports them.
  static const QStringList kInteresting = {
      QStringLiteral("avx2"),        QStringLiteral("fma"),         QStringLiteral("f16c"),
      QStringLiteral("avx512f"),     QStringLiteral("avx512bw"),    QStringLiteral("avx512_vnni"),
      QStringLiteral("avx512_bf16"), QStringLiteral("avx512_fp16"), QStringLiteral("amx_int8"),
      QStringLiteral("amx_bf16")};
  const QSet<QString> flags = [] {
    const QStringList l =
        procValue(QStringLiteral("/proc/cpuinfo"), QStringLiteral("flags")).split(QLatin1Char(' '));
    return QSet<QString>(l.begin(), l.end());
  }();
  QStringList have;
  for (const QString& f : kInteresting) {
    if (flags.contains(f)) have << f;
  }
  if (!have.isEmpty()) d.details << QObject::tr("Features: %1").arg(have.join(QStringLiteral(" ")));
  d.details << QObject::tr("Threads: %1 in the engine's pool (tiny models use 1)").arg(nThreads);
  d.memTotal = meminfoBytes(QStringLiteral("MemTotal"));
  d.memAvailable = meminfoBytes(QStringLiteral("MemAvailable"));
  return d;
}

DeviceInfo absentGpu(const QString& kind, const QString& id, const QColor& color,
                     const QString& why) {
  DeviceInfo d;
  d.kind = kind;
  d.backendId = id;
  d.name = kind;
  d.present = false;
  d.status = why;
  d.color = color;
  return d;
}

QVector<DeviceInfo> vulkanDevices(bool probe) {
  const QString kind = QStringLiteral("Vulkan");
  if (!loom::vulkan_built())
    return {absentGpu(kind, QStringLiteral("vulkan:0"), theme::kVulkan, QObject::tr("not built"))};
  if (!probe)
    return {absentGpu(kind, QStringLiteral("vulkan:0"), theme::kVulkan, QObject::tr("looking…"))};
  auto list = loom::list_vulkan_devices();
  if (!list.ok() || list->empty()) {
    DeviceInfo d =
        absentGpu(kind, QStringLiteral("vulkan:0"), theme::kVulkan, QObject::tr("none found"));
    if (!list.ok()) d.details << QString::fromStdString(list.message());
    return {d};
  }
  QVector<DeviceInfo> out;
  for (const loom::VulkanDeviceInfo& v : *list) {
    DeviceInfo d;
    d.kind = kind;
    d.backendId = QStringLiteral("vulkan:%1").arg(v.index);
    d.name = QString::fromStdString(v.name);
    d.color = theme::kVulkan;
    d.present = v.usable;
    d.status = v.usable ? QObject::tr("found") : QObject::tr("not usable");
    d.details << QObject::tr("Type: %1 · Vulkan %2")
                     .arg(QString::fromStdString(v.type), QString::fromStdString(v.api_version));
    if (!v.driver.empty())
      d.details << QObject::tr("Driver: %1").arg(QString::fromStdString(v.driver));
    if (!v.usable && !v.why_not.empty()) d.details << QString::fromStdString(v.why_not);
    if (v.device_local_bytes) d.memTotal = static_cast<qint64>(v.device_local_bytes);
    out << d;
  }
  return out;
}

QVector<DeviceInfo> cudaDevices(bool probe) {
  const QString kind = QStringLiteral("CUDA");
  if (!loom::cuda_built())
    return {absentGpu(kind, QStringLiteral("cuda:0"), theme::kCuda, QObject::tr("not built"))};
  if (!probe)
    return {absentGpu(kind, QStringLiteral("cuda:0"), theme::kCuda, QObject::tr("looking…"))};
  auto list = loom::list_cuda_devices();
  if (!list.ok() || list->empty()) {
    DeviceInfo d =
        absentGpu(kind, QStringLiteral("cuda:0"), theme::kCuda, QObject::tr("none found"));
    if (!list.ok()) d.details << QString::fromStdString(list.message());
    return {d};
  }
  QVector<DeviceInfo> out;
  for (const loom::CudaDeviceInfo& c : *list) {
    DeviceInfo d;
    d.kind = kind;
    d.backendId = QStringLiteral("cuda:%1").arg(c.index);
    d.name = QString::fromStdString(c.name);
    d.color = theme::kCuda;
    d.present = c.usable;
    d.status = c.usable ? QObject::tr("found") : QObject::tr("not usable");
    d.details << QObject::tr("Compute capability %1.%2 · %3 SMs")
                     .arg(c.cc_major)
                     .arg(c.cc_minor)
                     .arg(c.sm_count);
    if (!c.driver.empty())
      d.details << QObject::tr("Driver: CUDA %1").arg(QString::fromStdString(c.driver));
    if (!c.usable && !c.why_not.empty()) d.details << QString::fromStdString(c.why_not);
    if (c.total_bytes) d.memTotal = static_cast<qint64>(c.total_bytes);
    out << d;
  }
  return out;
}

}  // namespace

QVector<DeviceInfo> detectDevices(int nThreads, bool probeGpus) {
  QVector<DeviceInfo> out;
  out << cpuDevice(nThreads);
  out << vulkanDevices(probeGpus);
  out << cudaDevices(probeGpus);
  return out;
}

QVector<DeviceInfo> devicesUnderPlacement(QVector<DeviceInfo> devices,
                                          const QStringList& backendsUsed) {
  for (DeviceInfo& d : devices) {
    if (!d.inUse || d.backendId == QLatin1String("cpu") || backendsUsed.contains(d.backendId))
      continue;
    d.idle = true;
    d.status = QObject::tr("open, idle");
    d.details.prepend(backendsUsed.isEmpty()
                          ? QObject::tr("Open and ready; no model is loaded.")
                          : QObject::tr("Open and ready, but the applied placement runs every op "
                                        "group on the CPU: move cells to the GPU in Placement."));
  }
  return devices;
}

QVector<BackendInfo> backendsFromDevices(const QVector<DeviceInfo>& devices) {
  QVector<BackendInfo> out;
  QString gpuInUse;
  for (const DeviceInfo& d : devices) {
    if (d.inUse && d.backendId != QLatin1String("cpu")) gpuInUse = d.name;
  }
  for (const DeviceInfo& d : devices) {
    BackendInfo b;
    b.id = d.backendId;
    b.color = d.color;
    b.device = d.name;
    b.available = d.present && d.inUse;
    // The engine has one GPU unit: the device in use is "the GPU" of the grid.
    b.label = d.backendId == QLatin1String("cpu") ? QStringLiteral("CPU")
              : b.available                       ? QStringLiteral("GPU")
                                                  : d.kind;
    if (b.available && d.backendId != QLatin1String("cpu")) b.memoryBytes = d.memTotal;
    if (!d.present) {
      b.reason = QStringLiteral("%1: %2").arg(d.kind, d.status);
    } else if (!b.available) {
      b.reason = gpuInUse.isEmpty()
                     ? QObject::tr("%1: %2 %3").arg(d.kind, d.name, d.status)
                     : QObject::tr("%1: %2 is not used (Loom runs on one GPU at a time: %3)")
                           .arg(d.kind, d.name, gpuInUse);
    }
    out << b;
  }
  return out;
}

QVector<StrategyInfo> strategiesFor(const QVector<BackendInfo>& backends) {
  bool gpu = false;
  QStringList why;
  for (const BackendInfo& b : backends) {
    if (b.id == QLatin1String("cpu")) continue;
    if (b.available)
      gpu = true;
    else
      why << b.reason;
  }
  const QString noGpu = QObject::tr("Needs a GPU (%1)").arg(why.join(QStringLiteral("; ")));
  QVector<StrategyInfo> s;
  s << StrategyInfo{QStringLiteral("cpu"), QObject::tr("CPU only"), true, {}, false, false};
  s << StrategyInfo{
      QStringLiteral("gpu"), QObject::tr("All on GPU"), gpu, gpu ? QString() : noGpu, false, false};
  s << StrategyInfo{QStringLiteral("layers"),
                    QObject::tr("First N layers on GPU"),
                    gpu,
                    gpu ? QString() : noGpu,
                    true,
                    false};
  s << StrategyInfo{QStringLiteral("attn-gpu"),
                    QObject::tr("Attention on GPU, FFN while the budget lasts"),
                    gpu,
                    gpu ? QString() : noGpu,
                    false,
                    true};
  s << StrategyInfo{QStringLiteral("auto"),
                    QObject::tr("Auto (cost model, within the budget)"),
                    gpu,
                    gpu ? QString() : noGpu,
                    false,
                    true};
  s << StrategyInfo{QStringLiteral("adaptive"),
                    QObject::tr("Auto (adaptive): measures while generating, keeps the fastest"),
                    gpu,
                    gpu ? QString() : noGpu,
                    false,
                    true};
  s << StrategyInfo{
      QStringLiteral("custom"), QObject::tr("Custom (edit cells)"), true, {}, false, false};
  return s;
}
