#include "app/chat_settings_panel.h"

#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QFrame>
#include <QLabel>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QSpinBox>
#include <QTimer>
#include <QVBoxLayout>
#include <algorithm>
#include <climits>

namespace {

QDoubleSpinBox* dbl(QWidget* p, double lo, double hi, double step, int decimals,
                    const QString& tip) {
  auto* s = new QDoubleSpinBox(p);
  s->setRange(lo, hi);
  s->setSingleStep(step);
  s->setDecimals(decimals);
  s->setToolTip(tip);
  return s;
}

QSpinBox* integer(QWidget* p, int lo, int hi, const QString& special, const QString& tip) {
  auto* s = new QSpinBox(p);
  s->setRange(lo, hi);
  s->setSpecialValueText(special);  // shown at the minimum, which means "off" / "automatic"
  s->setToolTip(tip);
  return s;
}

}  // namespace

ChatSettingsPanel::ChatSettingsPanel(QWidget* parent) : QWidget(parent) {
  auto* v = new QVBoxLayout(this);
  v->setContentsMargins(16, 16, 16, 16);
  v->setSpacing(12);

  auto* card = new QFrame(this);
  card->setObjectName(QStringLiteral("Card"));
  auto* cv = new QVBoxLayout(card);
  cv->setContentsMargins(14, 12, 14, 12);
  auto* title = new QLabel(tr("System prompt"), card);
  title->setObjectName(QStringLiteral("CardTitle"));
  cv->addWidget(title);
  m_system = new QPlainTextEdit(card);
  m_system->setObjectName(QStringLiteral("SystemPrompt"));
  m_system->setPlaceholderText(tr("Optional: how the assistant should behave in this chat"));
  m_system->setFixedHeight(96);
  cv->addWidget(m_system);
  v->addWidget(card);

  auto* card2 = new QFrame(this);
  card2->setObjectName(QStringLiteral("Card"));
  auto* c2 = new QVBoxLayout(card2);
  c2->setContentsMargins(14, 12, 14, 12);
  auto* title2 = new QLabel(tr("Sampling"), card2);
  title2->setObjectName(QStringLiteral("CardTitle"));
  c2->addWidget(title2);
  auto* form = new QFormLayout;
  form->setLabelAlignment(Qt::AlignLeft);
  form->setHorizontalSpacing(16);
  form->setVerticalSpacing(8);
  m_temperature = dbl(card2, 0.0, 2.0, 0.05, 2, tr("0: always the most likely token (greedy)"));
  m_topK = integer(card2, 0, 1000, tr("off"), tr("Keep the k most likely tokens (0: off)"));
  m_topP = dbl(card2, 0.0, 1.0, 0.01, 2,
               tr("Keep the most likely tokens up to this total probability (1: off)"));
  m_minP = dbl(card2, 0.0, 1.0, 0.01, 2,
               tr("Drop tokens less likely than this fraction of the best one (0: off)"));
  m_repeat = dbl(card2, 1.0, 2.0, 0.01, 2, tr("Penalise tokens of the last 64 (1: off)"));
  m_seed = integer(card2, -1, INT_MAX, tr("random"),
                   tr("The same seed and settings give the same reply (-1: random)"));
  m_maxTokens =
      integer(card2, -1, 1 << 20, tr("until the context is full"), tr("Most tokens in one reply"));
  m_ctx = integer(card2, 0, 1 << 20, tr("model default"),
                  tr("Tokens of context (0: the model's own, at most 4096)"));
  m_ctx->setSingleStep(512);
  form->addRow(tr("Temperature"), m_temperature);
  form->addRow(tr("Top-k"), m_topK);
  form->addRow(tr("Top-p"), m_topP);
  form->addRow(tr("Min-p"), m_minP);
  form->addRow(tr("Repetition penalty"), m_repeat);
  form->addRow(tr("Seed"), m_seed);
  form->addRow(tr("Max tokens"), m_maxTokens);
  form->addRow(tr("Context length"), m_ctx);
  c2->addLayout(form);
  m_ctxHint = new QLabel(card2);
  m_ctxHint->setObjectName(QStringLiteral("Muted"));
  m_ctxHint->setWordWrap(true);
  c2->addWidget(m_ctxHint);
  auto* reset = new QPushButton(tr("Reset to defaults"), card2);
  connect(reset, &QPushButton::clicked, this, [this] {
    loom::storage::ChatSettings d;
    d.system_prompt = m_system->toPlainText().toStdString();  // the prompt is not a "default"
    setSettings(d, isEnabled());
    edited();
  });
  c2->addWidget(reset, 0, Qt::AlignRight);
  v->addWidget(card2);
  v->addStretch(1);

  // Typing in the prompt saves once the user pauses, not per key.
  m_debounce = new QTimer(this);
  m_debounce->setSingleShot(true);
  m_debounce->setInterval(400);
  connect(m_debounce, &QTimer::timeout, this, &ChatSettingsPanel::edited);
  connect(m_system, &QPlainTextEdit::textChanged, this, [this] {
    if (!m_loading) m_debounce->start();
  });
  for (QDoubleSpinBox* s : {m_temperature, m_topP, m_minP, m_repeat}) {
    connect(s, &QDoubleSpinBox::valueChanged, this, &ChatSettingsPanel::edited);
  }
  for (QSpinBox* s : {m_topK, m_seed, m_maxTokens, m_ctx})
    connect(s, &QSpinBox::valueChanged, this, &ChatSettingsPanel::edited);
  setSettings({}, false);
}

void ChatSettingsPanel::setSettings(const loom::storage::ChatSettings& s, bool enabled) {
  m_loading = true;
  m_system->setPlainText(QString::fromStdString(s.system_prompt));
  m_temperature->setValue(s.temperature);
  m_topK->setValue(static_cast<int>(s.top_k));
  m_topP->setValue(s.top_p);
  m_minP->setValue(s.min_p);
  m_repeat->setValue(s.repeat_penalty);
  m_seed->setValue(static_cast<int>(std::clamp<int64_t>(s.seed, -1, INT_MAX)));
  m_maxTokens->setValue(static_cast<int>(std::clamp<int64_t>(s.max_tokens, -1, 1 << 20)));
  m_ctx->setValue(static_cast<int>(std::clamp<int64_t>(s.n_ctx, 0, 1 << 20)));
  setEnabled(enabled);
  m_loading = false;
}

loom::storage::ChatSettings ChatSettingsPanel::settings() const {
  loom::storage::ChatSettings s;
  s.system_prompt = m_system->toPlainText().toStdString();
  s.temperature = m_temperature->value();
  s.top_k = m_topK->value();
  s.top_p = m_topP->value();
  s.min_p = m_minP->value();
  s.repeat_penalty = m_repeat->value();
  s.seed = m_seed->value();
  s.max_tokens = m_maxTokens->value();
  s.n_ctx = m_ctx->value();
  return s;
}

void ChatSettingsPanel::setModelContext(int nCtxTrain) {
  m_ctxHint->setText(
      nCtxTrain > 0 ? tr("The model was trained with %1 tokens of context. Changing the length "
                         "rebuilds the KV cache at the next reply.")
                          .arg(nCtxTrain)
                    : QString());
}

void ChatSettingsPanel::edited() {
  if (m_loading || !isEnabled()) return;
  emit settingsEdited(settings());
}
