// The compute devices this machine and this build offer: the CPU (its ISA
// level and features, RAM), and the GPU backends (Vulkan, CUDA) with their
// memory. The placement grid's backends and the strategy selector's choices
// are derived from this list (the engine worker marks the GPU it opened).
#pragma once

#include <QColor>
#include <QString>
#include <QStringList>
#include <QVector>

#include "app/placement_model.h"

struct DeviceInfo {
  QString kind;       ///< "CPU", "Vulkan", "CUDA"
  QString backendId;  ///< the placement backend it stands for ("cpu", "vulkan:0")
  QString name;       ///< the device's own name, or the kind when absent
  QString status;     ///< "in use", "not built", "none found"
  bool present = false;
  bool inUse = false;   ///< the engine runs on it (the CPU; the GPU backend the worker opened)
  bool idle = false;    ///< opened, but the applied placement puts no op group on it
  QStringList details;  ///< one fact per line
  qint64 memTotal = 0, memAvailable = 0;  ///< bytes (host RAM for the CPU)
  QColor color;
};

Q_DECLARE_METATYPE(DeviceInfo)

/// Devices found. `nThreads`: the CPU backend's thread count. `probeGpus`:
/// ask the GPU backends for their devices (creates a Vulkan instance: tens of
/// milliseconds, so the worker thread does it); without it GPU entries say
/// "looking…" when the backend is built.
QVector<DeviceInfo> detectDevices(int nThreads, bool probeGpus = true);
/// The devices as the Devices tab shows them under the applied placement:
/// a GPU the engine opened but on which `backendsUsed` (the applied plan's
/// units; empty: no model) puts nothing is "open, idle", not "in use".
QVector<DeviceInfo> devicesUnderPlacement(QVector<DeviceInfo> devices,
                                          const QStringList& backendsUsed);
/// One BackendInfo per device (those not in use unavailable, with the reason).
QVector<BackendInfo> backendsFromDevices(const QVector<DeviceInfo>& devices);
/// The strategy selector's entries, enabled as the backends allow.
QVector<StrategyInfo> strategiesFor(const QVector<BackendInfo>& backends);
