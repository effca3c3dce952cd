#include "app/chat_list_model.h"

#include <QDateTime>
#include <QLocale>

namespace {

QString when(qint64 ms) {
  const QDateTime t = QDateTime::fromMSecsSinceEpoch(ms);
  const QDate today = QDate::currentDate();
  if (t.date() == today) return t.time().toString(QStringLiteral("HH:mm"));
  if (t.date() == today.addDays(-1)) return QObject::tr("Yesterday");
  if (t.date().daysTo(today) < 7)
    return QLocale().dayName(t.date().dayOfWeek(), QLocale::ShortFormat);
  return QLocale().toString(t.date(), QLocale::ShortFormat);
}

}  // namespace

ChatListModel::ChatListModel(loom::storage::Store* store, QObject* parent)
    : QAbstractListModel(parent), m_store(store) {
  reload();
}

void ChatListModel::reload() {
  beginResetModel();
  auto chats = m_store->list_chats(m_search.toStdString());
  if (chats.ok()) {
    m_chats = std::move(chats).value();
  } else {
    m_chats.clear();
    emit errorOccurred(QString::fromStdString(chats.message()));
  }
  endResetModel();
}

void ChatListModel::setSearch(const QString& text) {
  if (text == m_search) return;
  m_search = text;
  reload();
}

qint64 ChatListModel::createChat(const QString& title, const loom::storage::ChatSettings& settings,
                                 QString* error) {
  auto id = m_store->create_chat(title.toStdString(), settings);
  if (!id.ok()) {
    if (error) *error = QString::fromStdString(id.message());
    return 0;
  }
  // A new chat shows even when a search would hide it: the user just made it.
  m_search.clear();
  reload();
  return *id;
}

bool ChatListModel::renameChat(qint64 chatId, const QString& title, QString* error) {
  const QString t = title.trimmed();
  if (t.isEmpty()) return false;
  loom::Status st = m_store->rename_chat(chatId, t.toStdString());
  if (!st.ok()) {
    if (error) *error = QString::fromStdString(st.message());
    return false;
  }
  reload();
  return true;
}

bool ChatListModel::deleteChat(qint64 chatId, QString* error) {
  loom::Status st = m_store->delete_chat(chatId);
  if (!st.ok()) {
    if (error) *error = QString::fromStdString(st.message());
    return false;
  }
  reload();
  return true;
}

qint64 ChatListModel::chatIdAt(int row) const {
  return row >= 0 && row < static_cast<int>(m_chats.size()) ? m_chats[static_cast<size_t>(row)].id
                                                            : 0;
}

int ChatListModel::rowOf(qint64 chatId) const {
  for (size_t i = 0; i < m_chats.size(); ++i) {
    if (m_chats[i].id == chatId) return static_cast<int>(i);
  }
  return -1;
}

const loom::storage::ChatRow* ChatListModel::chat(qint64 chatId) const {
  const int r = rowOf(chatId);
  return r < 0 ? nullptr : &m_chats[static_cast<size_t>(r)];
}

int ChatListModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(m_chats.size());
}

QVariant ChatListModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= rowCount()) return {};
  const loom::storage::ChatRow& c = m_chats[static_cast<size_t>(index.row())];
  switch (role) {
    case Qt::DisplayRole:
    case Qt::EditRole: return QString::fromStdString(c.title);
    case Qt::ToolTipRole:
      return tr("%1\nLast change: %2")
          .arg(QString::fromStdString(c.title),
               QLocale().toString(QDateTime::fromMSecsSinceEpoch(c.updated_ms),
                                  QLocale::ShortFormat));
    case ChatIdRole: return QVariant::fromValue<qint64>(c.id);
    case UpdatedRole: return QVariant::fromValue<qint64>(c.updated_ms);
    case SubtitleRole: return when(c.updated_ms);
    default: return {};
  }
}

bool ChatListModel::setData(const QModelIndex& index, const QVariant& value, int role) {
  if (!index.isValid() || role != Qt::EditRole) return false;
  QString error;
  if (!renameChat(chatIdAt(index.row()), value.toString(), &error)) {
    if (!error.isEmpty()) emit errorOccurred(error);
    return false;
  }
  return true;
}

Qt::ItemFlags ChatListModel::flags(const QModelIndex& index) const {
  if (!index.isValid()) return Qt::NoItemFlags;
  return Qt::ItemIsEnabled | Qt::ItemIsSelectable | Qt::ItemIsEditable;
}
