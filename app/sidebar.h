// The left column: new chat, search, the chat list (rename, delete from its
// context menu or F2/Delete), and the model card (what is loaded, open another,
// recent models).
#pragma once

#include <QWidget>

#include "app/app_types.h"

class ChatListModel;
class ElidedLabel;
class QLabel;
class QLineEdit;
class QListView;
class QMenu;
class QPushButton;
class QToolButton;
class QFrame;

class Sidebar : public QWidget {
  Q_OBJECT
 public:
  Sidebar(ChatListModel* chats, QWidget* parent = nullptr);

  /// Highlights a chat (0: none) without emitting chatSelected.
  void selectChat(qint64 chatId);
  void setModel(const ModelSummary* model);  ///< null: none loaded
  /// Recent models for the menu: (path, label) pairs.
  void setRecentModels(const QList<QPair<QString, QString>>& recent);
  QListView* chatView() const { return m_list; }
  QLineEdit* searchField() const { return m_search; }
  /// The chat highlighted in the list (0: none).
  qint64 highlightedChat() const;
  /// Starts inline renaming of a chat.
  void beginRename(qint64 chatId);

 signals:
  void newChatRequested();
  void chatSelected(qint64 chatId);
  void deleteChatRequested(qint64 chatId);
  void openModelRequested();
  void recentModelRequested(const QString& path);
  void demoModelRequested();
  void aboutRequested();

 private:
  void showContextMenu(const QPoint& pos);

  ChatListModel* m_chats;
  QLineEdit* m_search = nullptr;
  QListView* m_list = nullptr;
  QFrame* m_modelCard = nullptr;
  ElidedLabel* m_modelName = nullptr;
  ElidedLabel* m_modelMeta = nullptr;   ///< architecture, layers, precision
  ElidedLabel* m_modelMeta2 = nullptr;  ///< file size, context, KV precision
  QLabel* m_demoBadge = nullptr;
  QToolButton* m_recent = nullptr;
  QMenu* m_recentMenu = nullptr;
  bool m_selecting = false;
  qint64 m_current = 0;  ///< the open chat (highlighted whenever it is listed)
};
