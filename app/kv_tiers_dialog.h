// "KV cache memory": where a long context's KV cache may live beyond the GPU
// (host RAM up to a budget, then a spill file on the SSD), which blocks spill
// first, and their precision there. The settings are kept per data folder
// (window.ini beside the store) and sent to the engine worker, which makes
// the loaded model's session again with them.
#pragma once

#include <QDialog>
#include <QString>

#include "app/app_types.h"

class QComboBox;
class QDoubleSpinBox;
class QLabel;
class QLineEdit;
class QPushButton;

class KvTiersDialog : public QDialog {
  Q_OBJECT
 public:
  /// `defaultDir`: the spill folder used when none is set (shown as the placeholder).
  KvTiersDialog(const KvTierSettings& current, const QString& defaultDir,
                QWidget* parent = nullptr);

  /// What the controls say now.
  KvTierSettings settings() const;
  /// Sets the controls (tests, and the constructor).
  void setSettings(const KvTierSettings& s);

  /// Reads / writes the settings under "kv/" in the ini file `path`.
  static KvTierSettings load(const QString& path);
  static void save(const QString& path, const KvTierSettings& s);
  /// One line for the placement panel: "RAM: automatic · SSD: ~/.cache/loom/kv".
  static QString summary(const KvTierSettings& s, const QString& defaultDir);

  void accept() override;

 private:
  void updateEnabled();

  QString m_defaultDir;
  QComboBox* m_gpuMode = nullptr;
  QDoubleSpinBox* m_gpuGiB = nullptr;
  QComboBox* m_ramMode = nullptr;
  QDoubleSpinBox* m_ramGiB = nullptr;
  QLineEdit* m_dir = nullptr;
  QPushButton* m_browse = nullptr;
  QComboBox* m_policy = nullptr;
  QComboBox* m_spillType = nullptr;
  QLabel* m_error = nullptr;
};
