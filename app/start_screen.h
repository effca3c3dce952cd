// What a first run shows instead of a chat: open a model, or try the built-in
// demo model (labelled plainly as random weights), or pick a recent model.
#pragma once

#include <QList>
#include <QPair>
#include <QStringList>
#include <QVector>
#include <QWidget>

#include "app/app_types.h"

class QPushButton;
class QVBoxLayout;
class QLabel;

class StartScreen : public QWidget {
  Q_OBJECT
 public:
  explicit StartScreen(QWidget* parent = nullptr);
  /// (path, label) pairs, most recent first.
  void setRecentModels(const QList<QPair<QString, QString>>& recent);
  /// Models found on the machine (those also in the recent list are left out);
  /// the first few are shown, the rest counted.
  void setFoundModels(const QVector<FoundModelInfo>& found);
  static constexpr int kFoundShown = 5;
  QPushButton* openButton() const { return m_open; }
  QPushButton* demoButton() const { return m_demo; }

 signals:
  void openModelRequested();
  void demoModelRequested();
  void recentModelRequested(const QString& path);  ///< also a found model

 private:
  QPushButton* m_open = nullptr;
  QPushButton* m_demo = nullptr;
  QLabel* m_recentTitle = nullptr;
  QVBoxLayout* m_recent = nullptr;
  QLabel* m_foundTitle = nullptr;
  QVBoxLayout* m_found = nullptr;
  QLabel* m_foundMore = nullptr;
  QStringList m_recentPaths;
  QVector<FoundModelInfo> m_foundAll;
};
