// The chat logic between the views, the store and the engine worker: send,
// stop, regenerate, edit-and-resend, copy, switch and delete chats.
//
// Order of a turn: the user message and an empty assistant message (state
// "streaming") are saved first; then the worker generates, saving the text as
// it streams and the final state at the end; the GUI only shows. Nothing here
// waits for the worker.
#pragma once

#include <QObject>
#include <QString>

#include "app/app_types.h"
#include "storage/store.h"

class ChatListModel;
class ChatSettingsPanel;
class Composer;
class EngineWorker;
class Sidebar;
class TranscriptView;

class ChatController : public QObject {
  Q_OBJECT
 public:
  ChatController(loom::storage::Store* store, EngineWorker* worker, ChatListModel* chats,
                 Sidebar* sidebar, TranscriptView* transcript, Composer* composer,
                 ChatSettingsPanel* settings, QObject* parent = nullptr);

  qint64 currentChat() const { return m_chatId; }
  bool isBusy() const { return m_request.requestId != 0; }
  quint64 currentRequest() const { return m_request.requestId; }

  /// Whether a model is loaded (sending needs one), and the name replies are signed with.
  void setModelReady(bool ready, const QString& assistantName);

 public slots:
  void newChat();
  void openChat(qint64 chatId);
  /// Sends `text` in the current chat (a new chat when none), or replaces the
  /// message being edited.
  void send(const QString& text);
  void stop();
  void regenerate(qint64 assistantMessageId);
  void editMessage(qint64 userMessageId);
  void copyMessage(qint64 messageId);
  void deleteChat(qint64 chatId);
  /// Saves the settings panel's values to the current chat.
  void saveSettings(const loom::storage::ChatSettings& s);

  // From the worker (queued).
  void onTextUpdated(quint64 requestId, qint64 messageId, const QString& text);
  void onGenerationFinished(const GenerationResult& result);

 signals:
  void generateRequested(const GenerationRequest& request);
  void busyChanged(bool busy);
  void chatChanged(qint64 chatId, const QString& title);
  void errorOccurred(const QString& message);
  /// A batch of a streaming reply reached the view (`length`: characters so far).
  void replyUpdated(qint64 messageId, int length);
  /// A reply finished (tests and the screenshot mode wait for it).
  void replyFinished(const GenerationResult& result);

 private:
  /// Starts a reply to the messages saved in the current chat.
  void startReply();
  void reloadTranscript();
  void setBusy(quint64 requestId, qint64 chatId, qint64 messageId);
  bool check(const loom::Status& st);

  loom::storage::Store* m_store;
  EngineWorker* m_worker;
  ChatListModel* m_chats;
  Sidebar* m_sidebar;
  TranscriptView* m_transcript;
  Composer* m_composer;
  ChatSettingsPanel* m_settings;
  qint64 m_chatId = 0;
  qint64 m_editingId = 0;  ///< user message being edited (0: none)
  bool m_modelReady = false;
  QString m_assistantName;  ///< the loaded model's name, kept with each reply
  quint64 m_nextRequest = 1;
  struct Pending {
    quint64 requestId = 0;
    qint64 chatId = 0;
    qint64 messageId = 0;
  } m_request;
};
