// What a first run shows instead of a chat: open a model, or try the built-in
// demo model (labelled plainly as random weights), or pick a recent model.
#pragma once

#include <QList>
#include <QPair>
#include <QWidget>

class QPushButton;
class QVBoxLayout;
class QLabel;

class StartScreen : public QWidget {
  Q_OBJECT
 public:
  explicit StartScreen(QWidget* parent = nullptr);
  /// (path, label) pairs, most recent first.
  void setRecentModels(const QList<QPair<QString, QString>>& recent);
  QPushButton* openButton() const { return m_open; }
  QPushButton* demoButton() const { return m_demo; }

 signals:
  void openModelRequested();
  void demoModelRequested();
  void recentModelRequested(const QString& path);

 private:
  QPushButton* m_open = nullptr;
  QPushButton* m_demo = nullptr;
  QLabel* m_recentTitle = nullptr;
  QVBoxLayout* m_recent = nullptr;
};
