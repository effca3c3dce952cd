// The chat list: the store's chats, newest change first, filtered by a search
// text. Renaming goes through setData (inline edit); the store is the truth
// and the list reloads from it after every change.
#pragma once

#include <QAbstractListModel>
#include <QString>
#include <vector>

#include "storage/store.h"

class ChatListModel : public QAbstractListModel {
  Q_OBJECT
 public:
  enum Role { ChatIdRole = Qt::UserRole + 1, UpdatedRole, SubtitleRole };

  /// `store` is the GUI thread's connection; it must outlive the model.
  explicit ChatListModel(loom::storage::Store* store, QObject* parent = nullptr);

  /// Reads the chats again (keeping the search).
  void reload();
  void setSearch(const QString& text);
  const QString& search() const { return m_search; }

  /// A new chat (at the top); returns its id, or 0 with `error` set.
  qint64 createChat(const QString& title, const loom::storage::ChatSettings& settings,
                    QString* error);
  bool renameChat(qint64 chatId, const QString& title, QString* error);
  bool deleteChat(qint64 chatId, QString* error);

  qint64 chatIdAt(int row) const;
  int rowOf(qint64 chatId) const;  ///< -1 when not listed (e.g. filtered out)
  const loom::storage::ChatRow* chat(qint64 chatId) const;

  int rowCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  bool setData(const QModelIndex& index, const QVariant& value, int role) override;
  Qt::ItemFlags flags(const QModelIndex& index) const override;

 signals:
  void errorOccurred(const QString& message);

 private:
  loom::storage::Store* m_store;
  QString m_search;
  std::vector<loom::storage::ChatRow> m_chats;
};
