#include "app/server_controller.h"

#include <QCoreApplication>
#include <QDir>
#include <QFileInfo>
#include <QNetworkAccessManager>
#include <QNetworkReply>
#include <QNetworkRequest>
#include <QProcess>
#include <QRandomGenerator>
#include <QStandardPaths>
#include <QTimer>
#include <QUrl>

namespace {
constexpr int kPollMs = 500;
constexpr qsizetype kStderrKeep = 4096;
}  // namespace

ServerController::ServerController(QObject* parent) : QObject(parent) {
  m_timer = new QTimer(this);
  m_timer->setInterval(kPollMs);
  connect(m_timer, &QTimer::timeout, this, &ServerController::poll);
  m_net = new QNetworkAccessManager(this);
}

ServerController::~ServerController() {
  if (m_proc) {
    m_proc->disconnect(this);
    m_proc->terminate();
    if (!m_proc->waitForFinished(3000)) {
      m_proc->kill();
      m_proc->waitForFinished(1000);
    }
  }
}

QString ServerController::findCli() {
  const QString env = qEnvironmentVariable("LOOM_CLI");
  if (!env.isEmpty()) return QFileInfo(env).isExecutable() ? env : QString();
  const QString dir = QCoreApplication::applicationDirPath();
  for (const QString& p : {dir + QStringLiteral("/loom"), dir + QStringLiteral("/../tools/loom")}) {
    if (QFileInfo(p).isExecutable()) return QDir::cleanPath(p);
  }
  return QStandardPaths::findExecutable(QStringLiteral("loom"));
}

QString ServerController::newApiKey() {
  QString k;
  for (int i = 0; i < 4; ++i)
    k += QStringLiteral("%1").arg(QRandomGenerator::system()->generate(), 8, 16, QLatin1Char('0'));
  return k;
}

QString ServerController::address() const {
  return QStringLiteral("http://127.0.0.1:%1/v1").arg(m_settings.port);
}

void ServerController::setState(State s, const QString& error) {
  m_state = s;
  m_error = error;
  if (s == State::Running || s == State::Starting)
    m_timer->start();
  else
    m_timer->stop();
  emit stateChanged();
}

void ServerController::start(const QString& modelPath, const Settings& s) {
  if (m_proc) stop();
  m_settings = s;
  m_model = modelPath;
  m_active = 0;
  m_served = m_tokens = 0;
  m_stderr.clear();
  const QString cli = findCli();
  if (cli.isEmpty()) {
    setState(State::Failed, tr("the loom command-line program was not found beside loom-chat "
                               "or on PATH (set LOOM_CLI to its path)"));
    return;
  }
  QStringList args = {
      QStringLiteral("serve"),    QStringLiteral("-m"),    modelPath,
      QStringLiteral("--port"),   QString::number(s.port), QStringLiteral("--parallel"),
      QString::number(s.parallel)};
  if (s.lan) args << QStringLiteral("--host") << QStringLiteral("0.0.0.0");
  if (s.threads > 0) args << QStringLiteral("-t") << QString::number(s.threads);
  QStringList shown = args;
  if (!s.apiKey.isEmpty()) {
    args << QStringLiteral("--api-key") << s.apiKey;
    shown << QStringLiteral("--api-key") << QStringLiteral("…");
  }
  m_command = QFileInfo(cli).fileName() + QLatin1Char(' ') + shown.join(QLatin1Char(' '));
  m_proc = new QProcess(this);
  m_proc->setProcessChannelMode(QProcess::SeparateChannels);
  m_proc->setStandardOutputFile(QProcess::nullDevice());
  connect(m_proc, &QProcess::readyReadStandardError, this, [this] {
    m_stderr += m_proc->readAllStandardError();
    if (m_stderr.size() > kStderrKeep) m_stderr = m_stderr.right(kStderrKeep);
  });
  connect(m_proc, &QProcess::finished, this, [this](int code, QProcess::ExitStatus st) {
    m_stderr += m_proc->readAllStandardError();
    m_proc->deleteLater();
    m_proc = nullptr;
    if (m_state == State::Stopped) return;  // stop() asked for it
    // The last lines of what it said: why it ended (a port in use, a bad model...).
    QStringList lines = QString::fromUtf8(m_stderr).split(QLatin1Char('\n'), Qt::SkipEmptyParts);
    while (lines.size() > 3) lines.removeFirst();
    const QString why = lines.isEmpty() ? (st == QProcess::CrashExit ? tr("it crashed")
                                                                     : tr("exit code %1").arg(code))
                                        : lines.join(QLatin1Char('\n'));
    setState(State::Failed, tr("the server stopped: %1").arg(why));
  });
  connect(m_proc, &QProcess::errorOccurred, this, [this](QProcess::ProcessError e) {
    if (e != QProcess::FailedToStart || !m_proc) return;
    const QString msg = m_proc->errorString();
    m_proc->deleteLater();
    m_proc = nullptr;
    setState(State::Failed, tr("the server could not be started: %1").arg(msg));
  });
  setState(State::Starting);
  m_proc->start(cli, args);
}

void ServerController::stop() {
  if (m_proc) {
    QProcess* p = m_proc;
    m_proc = nullptr;
    p->disconnect(this);
    p->terminate();
    if (!p->waitForFinished(3000)) {
      p->kill();
      p->waitForFinished(1000);
    }
    p->deleteLater();
  }
  m_active = 0;
  setState(State::Stopped);
  emit statsChanged();
}

void ServerController::poll() {
  if (m_pollBusy || !m_proc) return;
  m_pollBusy = true;
  const bool starting = m_state == State::Starting;
  QNetworkRequest req(
      QUrl(QStringLiteral("http://127.0.0.1:%1/%2")
               .arg(m_settings.port)
               .arg(starting ? QStringLiteral("health") : QStringLiteral("metrics"))));
  if (!m_settings.apiKey.isEmpty())
    req.setRawHeader("Authorization", "Bearer " + m_settings.apiKey.toUtf8());
  req.setTransferTimeout(2000);
  QNetworkReply* r = m_net->get(req);
  connect(r, &QNetworkReply::finished, this, [this, r, starting] {
    r->deleteLater();
    m_pollBusy = false;
    if (!m_proc) return;
    const int status = r->attribute(QNetworkRequest::HttpStatusCodeAttribute).toInt();
    if (r->error() != QNetworkReply::NoError || status != 200) return;  // not up yet
    if (starting) {
      if (m_state == State::Starting) setState(State::Running);
      return;
    }
    parseMetrics(r->readAll());
  });
}

void ServerController::parseMetrics(const QByteArray& text) {
  int active = 0;
  qint64 served = 0, tokens = 0;
  for (const QByteArray& line : text.split('\n')) {
    if (line.startsWith('#')) continue;
    const qsizetype sp = line.lastIndexOf(' ');
    if (sp < 0) continue;
    const QByteArray name = line.left(sp);
    const qint64 v = line.mid(sp + 1).toLongLong();
    if (name == "loom_active_requests")
      active = static_cast<int>(v);
    else if (name == "loom_generated_tokens_total")
      tokens = v;
    else if (name.startsWith("loom_requests_total{route=\"/v1/"))
      served += v;
  }
  if (active == m_active && served == m_served && tokens == m_tokens) return;
  m_active = active;
  m_served = served;
  m_tokens = tokens;
  emit statsChanged();
}
