#include "app/chat_export.h"

#include <QDateTime>
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QObject>
#include <QSaveFile>

namespace {

QString stateName(loom::storage::MessageState s) {
  switch (s) {
    case loom::storage::MessageState::kComplete: return QStringLiteral("complete");
    case loom::storage::MessageState::kStreaming: return QStringLiteral("streaming");
    case loom::storage::MessageState::kStopped: return QStringLiteral("stopped");
    case loom::storage::MessageState::kError: return QStringLiteral("error");
  }
  return QStringLiteral("unknown");
}

QString isoTime(int64_t ms) {
  return QDateTime::fromMSecsSinceEpoch(ms).toUTC().toString(Qt::ISODate);
}

QString roleTitle(const std::string& role) {
  if (role == "user") return QObject::tr("User");
  if (role == "assistant") return QObject::tr("Assistant");
  if (role == "system") return QObject::tr("System");
  return QString::fromStdString(role);
}

}  // namespace

QString chatToMarkdown(const loom::storage::ChatRow& chat,
                       const std::vector<loom::storage::MessageRow>& messages) {
  QString out = QStringLiteral("# %1\n\n").arg(QString::fromStdString(chat.title));
  out += QObject::tr("_Exported from Loom; chat started %1._\n").arg(isoTime(chat.created_ms));
  for (const auto& m : messages) {
    // An assistant message is titled with the model that wrote it, where recorded.
    const QString title =
        m.role == "assistant" && !m.model.empty()
            ? QStringLiteral("%1 (%2)").arg(roleTitle(m.role), QString::fromStdString(m.model))
            : roleTitle(m.role);
    out += QStringLiteral("\n## %1\n\n").arg(title);
    out += QString::fromStdString(m.content);
    if (!out.endsWith(QLatin1Char('\n'))) out += QLatin1Char('\n');
    QString note = QString::fromStdString(m.meta);
    if (m.state != loom::storage::MessageState::kComplete)
      note = stateName(m.state) + (note.isEmpty() ? QString() : QStringLiteral(": ") + note);
    if (!note.isEmpty() && m.role != "user") out += QStringLiteral("\n_%1_\n").arg(note);
  }
  return out;
}

QByteArray chatToJson(const loom::storage::ChatRow& chat,
                      const std::vector<loom::storage::MessageRow>& messages) {
  QJsonObject settings{
      {QStringLiteral("system_prompt"), QString::fromStdString(chat.settings.system_prompt)},
      {QStringLiteral("temperature"), chat.settings.temperature},
      {QStringLiteral("top_k"), static_cast<qint64>(chat.settings.top_k)},
      {QStringLiteral("top_p"), chat.settings.top_p},
      {QStringLiteral("min_p"), chat.settings.min_p},
      {QStringLiteral("repeat_penalty"), chat.settings.repeat_penalty},
      {QStringLiteral("seed"), static_cast<qint64>(chat.settings.seed)},
      {QStringLiteral("max_tokens"), static_cast<qint64>(chat.settings.max_tokens)},
      {QStringLiteral("n_ctx"), static_cast<qint64>(chat.settings.n_ctx)},
  };
  QJsonArray list;
  for (const auto& m : messages) {
    QJsonObject o{
        {QStringLiteral("role"), QString::fromStdString(m.role)},
        {QStringLiteral("content"), QString::fromStdString(m.content)},
        {QStringLiteral("state"), stateName(m.state)},
        {QStringLiteral("meta"), QString::fromStdString(m.meta)},
        {QStringLiteral("created"), isoTime(m.created_ms)},
    };
    if (!m.model.empty()) o[QStringLiteral("model")] = QString::fromStdString(m.model);
    const QJsonObject origin =
        QJsonDocument::fromJson(QByteArray::fromStdString(m.origin)).object();
    if (!origin.isEmpty()) o[QStringLiteral("origin")] = origin;
    list.append(o);
  }
  const QJsonObject doc{
      {QStringLiteral("format"), QStringLiteral("loom-chat")},
      {QStringLiteral("version"), 1},
      {QStringLiteral("title"), QString::fromStdString(chat.title)},
      {QStringLiteral("created"), isoTime(chat.created_ms)},
      {QStringLiteral("updated"), isoTime(chat.updated_ms)},
      {QStringLiteral("settings"), settings},
      {QStringLiteral("messages"), list},
  };
  return QJsonDocument(doc).toJson(QJsonDocument::Indented);
}

bool exportChat(loom::storage::Store* store, qint64 chatId, const QString& path, QString* error) {
  if (!store) {
    *error = QObject::tr("No store is open.");
    return false;
  }
  auto chat = store->get_chat(chatId);
  if (!chat.ok()) {
    *error = QString::fromStdString(chat.message());
    return false;
  }
  auto messages = store->list_messages(chatId);
  if (!messages.ok()) {
    *error = QString::fromStdString(messages.message());
    return false;
  }
  const QByteArray bytes = path.endsWith(QStringLiteral(".json"), Qt::CaseInsensitive)
                               ? chatToJson(*chat, *messages)
                               : chatToMarkdown(*chat, *messages).toUtf8();
  QSaveFile f(path);
  if (!f.open(QIODevice::WriteOnly) || f.write(bytes) != bytes.size() || !f.commit()) {
    *error = QObject::tr("Could not write %1: %2").arg(path, f.errorString());
    return false;
  }
  return true;
}
