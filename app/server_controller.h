// "Serve over HTTP" from the app: runs `loom serve` (the CLI installed beside
// loom-chat) on the model the app has open, as a child process, so other
// programs reach it through the OpenAI API while the app keeps chatting; and
// polls its /health and /metrics for the state and the live request counts.
// A process of its own: the app's session and the server's slots never share
// a thread, and a server that fails cannot take the app's chats with it.
#pragma once

#include <QObject>
#include <QString>

class QNetworkAccessManager;
class QProcess;
class QTimer;

class ServerController : public QObject {
  Q_OBJECT
 public:
  struct Settings {
    int port = 8080;
    bool lan = false;  ///< listen on every address (else loopback only)
    QString apiKey;    ///< empty: no key
    int parallel = 4;  ///< sequences batched at once
    int threads = 0;   ///< CPU threads (0: the server's default)
    bool operator==(const Settings&) const = default;
  };
  enum class State { Stopped, Starting, Running, Failed };

  explicit ServerController(QObject* parent = nullptr);
  ~ServerController() override;  ///< stops the server

  /// Starts `loom serve` on `modelPath`; stateChanged() follows (Running once
  /// /health answers, Failed with lastError() when the process ends first).
  void start(const QString& modelPath, const Settings& s);
  /// Stops it (SIGTERM, then SIGKILL after 3 s).
  void stop();

  State state() const { return m_state; }
  const Settings& settings() const { return m_settings; }
  QString modelPath() const { return m_model; }
  /// http://HOST:PORT/v1 as clients on this machine reach it.
  QString address() const;
  QString lastError() const { return m_error; }
  /// From /metrics: requests running now, API requests answered, tokens generated.
  int activeRequests() const { return m_active; }
  qint64 servedRequests() const { return m_served; }
  qint64 generatedTokens() const { return m_tokens; }
  /// The command line started (for the panel).
  QString commandLine() const { return m_command; }

  /// The `loom` CLI: $LOOM_CLI, beside this program, the build tree's
  /// tools/loom, then PATH. Empty when none is found.
  static QString findCli();
  /// A random key (32 hex digits) for the API key field.
  static QString newApiKey();

 signals:
  void stateChanged();
  void statsChanged();

 private:
  void setState(State s, const QString& error = {});
  void poll();
  void parseMetrics(const QByteArray& text);

  QProcess* m_proc = nullptr;
  QTimer* m_timer = nullptr;
  QNetworkAccessManager* m_net = nullptr;
  bool m_pollBusy = false;
  State m_state = State::Stopped;
  Settings m_settings;
  QString m_model, m_error, m_command;
  QByteArray m_stderr;  ///< the process's messages (tail), for errors
  int m_active = 0;
  qint64 m_served = 0, m_tokens = 0;
};
