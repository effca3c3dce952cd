#include "app/chat_controller.h"

#include <QApplication>
#include <QClipboard>

#include "app/chat_list_model.h"
#include "app/chat_settings_panel.h"
#include "app/composer.h"
#include "app/engine_worker.h"
#include "app/sidebar.h"
#include "app/transcript_view.h"

namespace {

MessageStatus statusOf(loom::storage::MessageState s) {
  switch (s) {
    case loom::storage::MessageState::kStreaming: return MessageStatus::Streaming;
    case loom::storage::MessageState::kStopped: return MessageStatus::Stopped;
    case loom::storage::MessageState::kError: return MessageStatus::Error;
    case loom::storage::MessageState::kComplete: break;
  }
  return MessageStatus::Complete;
}

// A chat's first title: the first line of the first message, shortened.
QString titleFrom(const QString& text) {
  QString t = text.section(QLatin1Char('\n'), 0, 0).simplified();
  if (t.size() > 48) t = t.left(45).trimmed() + QStringLiteral("…");
  return t.isEmpty() ? QObject::tr("New chat") : t;
}

SamplingSettings samplingOf(const loom::storage::ChatSettings& s) {
  SamplingSettings o;
  o.temperature = s.temperature;
  o.topK = static_cast<int>(s.top_k);
  o.topP = s.top_p;
  o.minP = s.min_p;
  o.repeatPenalty = s.repeat_penalty;
  o.seed = s.seed;
  o.maxTokens = static_cast<int>(s.max_tokens);
  o.nCtx = static_cast<int>(s.n_ctx);
  return o;
}

}  // namespace

ChatController::ChatController(loom::storage::Store* store, EngineWorker* worker,
                               ChatListModel* chats, Sidebar* sidebar, TranscriptView* transcript,
                               Composer* composer, ChatSettingsPanel* settings, QObject* parent)
    : QObject(parent),
      m_store(store),
      m_worker(worker),
      m_chats(chats),
      m_sidebar(sidebar),
      m_transcript(transcript),
      m_composer(composer),
      m_settings(settings) {
  connect(m_composer, &Composer::sendRequested, this, &ChatController::send);
  connect(m_composer, &Composer::stopRequested, this, &ChatController::stop);
  connect(m_composer, &Composer::editCancelled, this, [this] { m_editingId = 0; });
  connect(m_transcript, &TranscriptView::copyRequested, this, &ChatController::copyMessage);
  connect(m_transcript, &TranscriptView::regenerateRequested, this, &ChatController::regenerate);
  connect(m_transcript, &TranscriptView::editRequested, this, &ChatController::editMessage);
  connect(m_sidebar, &Sidebar::chatSelected, this, &ChatController::openChat);
  connect(m_sidebar, &Sidebar::newChatRequested, this, &ChatController::newChat);
  connect(m_settings, &ChatSettingsPanel::settingsEdited, this, &ChatController::saveSettings);
}

bool ChatController::check(const loom::Status& st) {
  if (st.ok()) return true;
  emit errorOccurred(QString::fromStdString(st.message()));
  return false;
}

void ChatController::setModelReady(bool ready, const QString& assistantName) {
  m_modelReady = ready;
  m_assistantName = assistantName;
  m_transcript->setAssistantName(assistantName);
  m_composer->setReady(ready, tr("Open a model to start chatting"));
  // Regenerate and Edit need a model: without one, past chats are read only.
  m_transcript->refreshActions(isBusy() || !m_modelReady);
}

void ChatController::newChat() {
  // An empty "New chat" is reused rather than piling up.
  if (m_chatId) {
    auto msgs = m_store->list_messages(m_chatId);
    if (msgs.ok() && msgs->empty()) {
      m_composer->input()->setFocus();
      return;
    }
  }
  QString error;
  // New chats start from the settings of the one open now (its system prompt included): the usual
  // wish.
  const loom::storage::ChatSettings s =
      m_chatId ? m_settings->settings() : loom::storage::ChatSettings();
  const qint64 id = m_chats->createChat(tr("New chat"), s, &error);
  if (!id) return emit errorOccurred(error);
  openChat(id);
  m_composer->input()->setFocus();
}

void ChatController::openChat(qint64 chatId) {
  m_chatId = chatId;
  m_editingId = 0;
  m_composer->setEditing(false);
  m_sidebar->selectChat(chatId);
  reloadTranscript();
  QString title;
  if (chatId) {
    auto c = m_store->get_chat(chatId);
    if (c.ok()) {
      m_settings->setSettings(c->settings, true);
      title = QString::fromStdString(c->title);
    }
  } else {
    m_settings->setSettings({}, false);
  }
  emit chatChanged(chatId, title);
}

void ChatController::reloadTranscript() {
  m_transcript->clear();
  if (!m_chatId) {
    m_transcript->refreshActions(isBusy() || !m_modelReady);
    return;
  }
  auto msgs = m_store->list_messages(m_chatId);
  if (!msgs.ok()) return emit errorOccurred(QString::fromStdString(msgs.message()));
  for (const auto& m : *msgs) {
    if (m.role == "system") continue;
    MessageData d;
    d.id = m.id;
    d.role = QString::fromStdString(m.role);
    d.content = QString::fromStdString(m.content);
    d.meta = QString::fromStdString(m.meta);
    d.model = QString::fromStdString(m.model);
    d.origin = QString::fromStdString(m.origin);
    d.status = statusOf(m.state);
    // Only this process's live request streams; an old "streaming" row was interrupted.
    if (d.status == MessageStatus::Streaming && m.id != m_request.messageId)
      d.status = MessageStatus::Stopped;
    m_transcript->addMessage(d);
  }
  m_transcript->refreshActions(isBusy() || !m_modelReady);
  m_transcript->scrollToBottom();
}

void ChatController::send(const QString& text) {
  if (isBusy() || !m_modelReady || text.trimmed().isEmpty()) return;
  if (!m_chatId) {
    QString error;
    const qint64 id = m_chats->createChat(titleFrom(text), {}, &error);
    if (!id) return emit errorOccurred(error);
    openChat(id);
  }
  if (m_editingId) {
    // Edit-and-resend: the edited message and everything after it go.
    if (!check(m_store->delete_messages_from(m_editingId))) return;
    m_editingId = 0;
    m_composer->setEditing(false);
    reloadTranscript();
  }
  // The first message names a chat still called "New chat".
  if (const auto c = m_store->get_chat(m_chatId);
      c.ok() && c->title == tr("New chat").toStdString()) {
    const auto msgs = m_store->list_messages(m_chatId);
    if (msgs.ok() && msgs->empty() &&
        check(m_store->rename_chat(m_chatId, titleFrom(text).toStdString()))) {
      emit chatChanged(m_chatId, titleFrom(text));
    }
  }
  auto userId = m_store->add_message(m_chatId, "user", text.toStdString());
  if (!userId.ok()) return emit errorOccurred(QString::fromStdString(userId.message()));
  m_composer->clear();
  MessageData d;
  d.id = *userId;
  d.role = QStringLiteral("user");
  d.content = text;
  m_transcript->addMessage(d);
  m_transcript->scrollToBottom();
  startReply();
}

void ChatController::startReply() {
  auto chat = m_store->get_chat(m_chatId);
  auto msgs = m_store->list_messages(m_chatId);
  if (!chat.ok() || !msgs.ok())
    return emit errorOccurred(
        QString::fromStdString((chat.ok() ? msgs.status() : chat.status()).message()));
  GenerationRequest req;
  req.chatId = m_chatId;
  req.sampling = samplingOf(chat->settings);
  if (!chat->settings.system_prompt.empty()) {
    req.turns << ChatTurn{QStringLiteral("system"),
                          QString::fromStdString(chat->settings.system_prompt)};
  }
  for (const auto& m : *msgs) {
    // Earlier failed replies are not part of the conversation the model sees.
    if (m.role == "assistant" && m.state == loom::storage::MessageState::kError) continue;
    req.turns << ChatTurn{QString::fromStdString(m.role), QString::fromStdString(m.content)};
  }
  // Saved before generation starts: a crash from here on keeps the row.
  auto replyId =
      m_store->add_message(m_chatId, "assistant", "", loom::storage::MessageState::kStreaming);
  if (!replyId.ok()) return emit errorOccurred(QString::fromStdString(replyId.message()));
  req.messageId = *replyId;
  req.requestId = m_nextRequest++;
  // The model that writes it, kept with it (the worker adds placement, KV
  // cache and sampling when it starts): a later model does not relabel it.
  (void)m_store->set_message_origin(req.messageId, m_assistantName.toStdString(), "");
  MessageData d;
  d.id = req.messageId;
  d.role = QStringLiteral("assistant");
  d.model = m_assistantName;
  d.status = MessageStatus::Streaming;
  m_transcript->addMessage(d);
  setBusy(req.requestId, m_chatId, req.messageId);
  m_chats->reload();
  m_sidebar->selectChat(m_chatId);
  emit generateRequested(req);
}

void ChatController::setBusy(quint64 requestId, qint64 chatId, qint64 messageId) {
  const bool was = isBusy();
  m_request = {requestId, chatId, messageId};
  m_composer->setBusy(isBusy());
  m_transcript->refreshActions(isBusy() || !m_modelReady);
  if (was != isBusy()) emit busyChanged(isBusy());
}

void ChatController::stop() {
  if (isBusy()) m_worker->requestStop(m_request.requestId);
}

void ChatController::onTextUpdated(quint64 requestId, qint64 messageId, const QString& text) {
  if (requestId != m_request.requestId || m_request.chatId != m_chatId)
    return;  // another chat is shown
  m_transcript->setMessageText(messageId, text);
  emit replyUpdated(messageId, static_cast<int>(text.size()));
}

void ChatController::onGenerationFinished(const GenerationResult& r) {
  if (r.requestId != m_request.requestId) return;
  const bool visible = m_request.chatId == m_chatId;
  setBusy(0, 0, 0);
  if (visible) {
    MessageStatus st = MessageStatus::Complete;
    if (!r.error.isEmpty())
      st = MessageStatus::Error;
    else if (r.cancelled)
      st = MessageStatus::Stopped;
    m_transcript->setMessageText(r.messageId, r.text);
    m_transcript->setMessageStatus(r.messageId, st, r.meta);
    // What the worker recorded when it started (placement, KV, sampling).
    if (auto row = m_store->get_message(r.messageId); row.ok()) {
      m_transcript->setMessageOrigin(r.messageId, QString::fromStdString(row->model),
                                     QString::fromStdString(row->origin));
    }
    m_transcript->refreshActions(false);
  }
  if (!r.error.isEmpty()) emit errorOccurred(tr("The reply failed: %1").arg(r.error));
  emit replyFinished(r);
}

void ChatController::regenerate(qint64 assistantMessageId) {
  if (isBusy() || !m_modelReady) return;
  if (!check(m_store->delete_messages_from(assistantMessageId))) return;
  reloadTranscript();
  startReply();
}

void ChatController::editMessage(qint64 userMessageId) {
  if (isBusy()) return;
  auto m = m_store->get_message(userMessageId);
  if (!m.ok()) return emit errorOccurred(QString::fromStdString(m.message()));
  m_editingId = userMessageId;
  m_composer->setEditing(true);
  m_composer->setText(QString::fromStdString(m->content));
  m_composer->input()->setFocus();
}

void ChatController::copyMessage(qint64 messageId) {
  if (MessageWidget* w = m_transcript->message(messageId))
    QApplication::clipboard()->setText(w->text());
}

void ChatController::deleteChat(qint64 chatId) {
  if (isBusy() && m_request.chatId == chatId) stop();
  QString error;
  if (!m_chats->deleteChat(chatId, &error)) return emit errorOccurred(error);
  if (chatId == m_chatId) openChat(m_chats->chatIdAt(0));
}

void ChatController::saveSettings(const loom::storage::ChatSettings& s) {
  if (m_chatId) check(m_store->set_chat_settings(m_chatId, s));
}
