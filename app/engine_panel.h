// The right-hand panel: Placement (grid and strategy), Performance (live
// charts), Devices (what this machine and build offer), Chat (settings) and
// Server (the open model over the OpenAI API).
#pragma once

#include <QTabWidget>
#include <QVector>
#include <memory>

#include "app/device_info.h"

class ChartsPanel;
class ChatSettingsPanel;
class LiveStats;
class PlacementModel;
class PlacementPanel;
class PresetListModel;
class QVBoxLayout;
class ServerPanel;

class EnginePanel : public QTabWidget {
  Q_OBJECT
 public:
  enum Tab { PlacementTab = 0, PerformanceTab, DevicesTab, ChatTab, ServerTab };

  EnginePanel(PlacementModel* placement, PresetListModel* presets, std::shared_ptr<LiveStats> stats,
              QWidget* parent = nullptr);

  PlacementPanel* placementPanel() const { return m_placement; }
  ChartsPanel* chartsPanel() const { return m_charts; }
  ChatSettingsPanel* chatSettings() const { return m_chatSettings; }
  ServerPanel* serverPanel() const { return m_server; }
  void setDevices(const QVector<DeviceInfo>& devices);
  /// "Kind: status" of each device card, as shown (tests).
  QStringList deviceStatuses() const;

 private:
  PlacementPanel* m_placement = nullptr;
  ChartsPanel* m_charts = nullptr;
  ChatSettingsPanel* m_chatSettings = nullptr;
  ServerPanel* m_server = nullptr;
  QWidget* m_devices = nullptr;
  QVBoxLayout* m_deviceList = nullptr;
};
