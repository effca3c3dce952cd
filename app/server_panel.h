// The engine panel's Server tab: serve the open model over the OpenAI API
// (ServerController runs `loom serve`): port, reachable from other
// computers or not, API key, parallel sequences; the address, the key and the
// live request count while it runs, the reason when it stops.
#pragma once

#include <QWidget>

#include "app/server_controller.h"

class QCheckBox;
class QLabel;
class QLineEdit;
class QPushButton;
class QSpinBox;

class ServerPanel : public QWidget {
  Q_OBJECT
 public:
  explicit ServerPanel(QWidget* parent = nullptr);

  /// The model the app has open (empty: none; Start is then disabled).
  void setModel(const QString& path, const QString& name);
  /// CPU threads the server is given (the app's setting).
  void setThreads(int threads) { m_threads = threads; }
  ServerController* controller() const { return m_ctl; }

  // The panel's settings as entered (tests).
  ServerController::Settings settings() const;
  void setSettings(const ServerController::Settings& s);
  /// Starts or stops, as the button does.
  void toggle();
  /// What the status line says now (tests).
  QString statusText() const;

 private:
  void refresh();

  ServerController* m_ctl = nullptr;
  QString m_modelPath, m_modelName;
  int m_threads = 0;
  QSpinBox* m_port = nullptr;
  QSpinBox* m_parallel = nullptr;
  QCheckBox* m_lan = nullptr;
  QLineEdit* m_key = nullptr;
  QPushButton* m_newKey = nullptr;
  QPushButton* m_button = nullptr;
  QLabel* m_status = nullptr;
  QLabel* m_stats = nullptr;
  QLabel* m_command = nullptr;
};
