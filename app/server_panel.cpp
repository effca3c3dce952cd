#include "app/server_panel.h"

#include <QCheckBox>
#include <QFileInfo>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSpinBox>
#include <QVBoxLayout>

ServerPanel::ServerPanel(QWidget* parent) : QWidget(parent) {
  m_ctl = new ServerController(this);
  auto* v = new QVBoxLayout(this);
  v->setContentsMargins(16, 16, 16, 16);
  v->setSpacing(10);
  auto* intro = new QLabel(tr("Serve the open model to other programs through the OpenAI API "
                              "(/v1/chat/completions, /v1/completions, /v1/models), with "
                              "continuous batching of their requests. The chat here goes on."),
                           this);
  intro->setWordWrap(true);
  intro->setObjectName(QStringLiteral("Muted"));
  v->addWidget(intro);

  auto* form = new QFormLayout;
  m_port = new QSpinBox(this);
  m_port->setRange(1024, 65535);
  m_port->setValue(8080);
  form->addRow(tr("Port"), m_port);
  m_parallel = new QSpinBox(this);
  m_parallel->setRange(1, 64);
  m_parallel->setValue(4);
  m_parallel->setToolTip(tr("Requests generated at once, batched in each step"));
  form->addRow(tr("Parallel requests"), m_parallel);
  m_lan = new QCheckBox(tr("Reachable from other computers"), this);
  m_lan->setToolTip(
      tr("Listen on every network address instead of this computer only; "
         "set an API key then"));
  form->addRow(QString(), m_lan);
  auto* keyRow = new QHBoxLayout;
  m_key = new QLineEdit(this);
  m_key->setPlaceholderText(tr("none"));
  m_newKey = new QPushButton(tr("New key"), this);
  keyRow->addWidget(m_key, 1);
  keyRow->addWidget(m_newKey);
  form->addRow(tr("API key"), keyRow);
  v->addLayout(form);

  m_button = new QPushButton(this);
  m_button->setObjectName(QStringLiteral("PrimaryButton"));
  v->addWidget(m_button, 0, Qt::AlignLeft);
  m_status = new QLabel(this);
  m_status->setWordWrap(true);
  m_status->setTextInteractionFlags(Qt::TextSelectableByMouse);
  v->addWidget(m_status);
  m_stats = new QLabel(this);
  v->addWidget(m_stats);
  m_command = new QLabel(this);
  m_command->setObjectName(QStringLiteral("Muted"));
  m_command->setWordWrap(true);
  m_command->setTextInteractionFlags(Qt::TextSelectableByMouse);
  v->addWidget(m_command);
  v->addStretch(1);

  connect(m_newKey, &QPushButton::clicked, this,
          [this] { m_key->setText(ServerController::newApiKey()); });
  connect(m_button, &QPushButton::clicked, this, &ServerPanel::toggle);
  connect(m_ctl, &ServerController::stateChanged, this, &ServerPanel::refresh);
  connect(m_ctl, &ServerController::statsChanged, this, &ServerPanel::refresh);
  refresh();
}

void ServerPanel::setModel(const QString& path, const QString& name) {
  m_modelPath = path;
  m_modelName = name;
  refresh();
}

ServerController::Settings ServerPanel::settings() const {
  ServerController::Settings s;
  s.port = m_port->value();
  s.parallel = m_parallel->value();
  s.lan = m_lan->isChecked();
  s.apiKey = m_key->text().trimmed();
  s.threads = m_threads;
  return s;
}

void ServerPanel::setSettings(const ServerController::Settings& s) {
  m_port->setValue(s.port);
  m_parallel->setValue(s.parallel);
  m_lan->setChecked(s.lan);
  m_key->setText(s.apiKey);
  m_threads = s.threads;
}

void ServerPanel::toggle() {
  const auto st = m_ctl->state();
  if (st == ServerController::State::Running || st == ServerController::State::Starting) {
    m_ctl->stop();
  } else if (!m_modelPath.isEmpty()) {
    m_ctl->start(m_modelPath, settings());
  }
}

QString ServerPanel::statusText() const {
  return m_status->text();
}

void ServerPanel::refresh() {
  using State = ServerController::State;
  const State st = m_ctl->state();
  const bool on = st == State::Running || st == State::Starting;
  for (QWidget* w : {static_cast<QWidget*>(m_port), static_cast<QWidget*>(m_parallel),
                     static_cast<QWidget*>(m_lan), static_cast<QWidget*>(m_key),
                     static_cast<QWidget*>(m_newKey)})
    w->setEnabled(!on);
  m_button->setText(on ? tr("Stop server") : tr("Start server"));
  m_button->setEnabled(on || !m_modelPath.isEmpty());
  const ServerController::Settings& s = m_ctl->settings();
  switch (st) {
    case State::Stopped:
      m_status->setText(m_modelPath.isEmpty()
                            ? tr("Open a model to serve it.")
                            : tr("Not serving. Start serves %1.").arg(m_modelName));
      break;
    case State::Starting: m_status->setText(tr("Starting the server…")); break;
    case State::Running:
      m_status->setText(
          tr("Serving %1 at %2%3%4")
              .arg(QFileInfo(m_ctl->modelPath()).fileName(), m_ctl->address(),
                   s.lan ? tr(" (and on this computer's network addresses)") : QString(),
                   s.apiKey.isEmpty() ? tr(", no API key") : tr(", key %1").arg(s.apiKey)));
      break;
    case State::Failed: m_status->setText(m_ctl->lastError()); break;
  }
  m_status->setStyleSheet(st == State::Failed ? QStringLiteral("color:#b91c1c;") : QString());
  m_stats->setText(st == State::Running ? tr("%1 running now, %2 answered, %3 tokens generated")
                                              .arg(m_ctl->activeRequests())
                                              .arg(m_ctl->servedRequests())
                                              .arg(m_ctl->generatedTokens())
                                        : QString());
  m_command->setText(on ? m_ctl->commandLine() : QString());
}
