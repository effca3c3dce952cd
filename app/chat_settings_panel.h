// The current chat's system prompt and sampling settings. Edits are saved to
// the chat (the owner writes them to the store) and used from the next reply.
#pragma once

#include <QWidget>

#include "storage/store.h"

class QDoubleSpinBox;
class QPlainTextEdit;
class QSpinBox;
class QLabel;
class QTimer;

class ChatSettingsPanel : public QWidget {
  Q_OBJECT
 public:
  explicit ChatSettingsPanel(QWidget* parent = nullptr);

  /// Shows a chat's settings (no signal). `enabled`: a chat is open.
  void setSettings(const loom::storage::ChatSettings& s, bool enabled);
  loom::storage::ChatSettings settings() const;
  /// The model's training context, for the context field's hint.
  void setModelContext(int nCtxTrain);

 signals:
  /// Emitted shortly after the user stops typing (the system prompt) or at once (numbers).
  void settingsEdited(const loom::storage::ChatSettings& s);

 private:
  void edited();

  QPlainTextEdit* m_system = nullptr;
  QDoubleSpinBox* m_temperature = nullptr;
  QSpinBox* m_topK = nullptr;
  QDoubleSpinBox* m_topP = nullptr;
  QDoubleSpinBox* m_minP = nullptr;
  QDoubleSpinBox* m_repeat = nullptr;
  QSpinBox* m_seed = nullptr;
  QSpinBox* m_maxTokens = nullptr;
  QSpinBox* m_ctx = nullptr;
  QLabel* m_ctxHint = nullptr;
  QTimer* m_debounce = nullptr;
  bool m_loading = false;
};
