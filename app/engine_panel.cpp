#include "app/engine_panel.h"

#include <QFrame>
#include <QHBoxLayout>
#include <QLabel>
#include <QProgressBar>
#include <QScrollArea>
#include <QVBoxLayout>

#include "app/charts_panel.h"
#include "app/chat_settings_panel.h"
#include "app/engine_bridge.h"
#include "app/placement_panel.h"
#include "app/server_panel.h"
#include "app/theme.h"
#include "engine/runtime/kv_cache.h"

namespace {

QWidget* scrolled(QWidget* inner, QWidget* parent) {
  auto* s = new QScrollArea(parent);
  s->setWidgetResizable(true);
  s->setFrameShape(QFrame::NoFrame);
  s->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  inner->setObjectName(QStringLiteral("RightPanel"));
  s->setWidget(inner);
  return s;
}

QFrame* deviceCard(const DeviceInfo& d, QWidget* parent) {
  auto* f = new QFrame(parent);
  f->setObjectName(QStringLiteral("Card"));
  auto* v = new QVBoxLayout(f);
  v->setContentsMargins(14, 12, 14, 12);
  v->setSpacing(4);
  auto* head = new QHBoxLayout;
  auto* dot = new QLabel(QStringLiteral("●"), f);
  dot->setStyleSheet(QStringLiteral("color:%1;font-size:14pt;")
                         .arg(theme::css(d.present ? d.color : theme::kBorder)));
  auto* kind = new QLabel(d.kind, f);
  kind->setObjectName(QStringLiteral("CardTitle"));
  auto* status = new QLabel(d.status, f);
  status->setObjectName(QStringLiteral("DeviceStatus"));
  const bool inUse = d.present && d.inUse && !d.idle;
  status->setStyleSheet(
      inUse ? QStringLiteral("background:#e7f6f2;color:#0f766e;border-radius:6px;padding:2px 8px;"
                             "font-size:8.5pt;font-weight:600;")
      : d.present
          ? QStringLiteral("background:#eef0ff;color:#4338ca;border-radius:6px;padding:2px 8px;"
                           "font-size:8.5pt;font-weight:600;")
          : QStringLiteral("background:#f1f2f5;color:%1;border-radius:6px;padding:2px 8px;"
                           "font-size:8.5pt;font-weight:600;")
                .arg(theme::css(theme::kMuted)));
  head->addWidget(dot);
  head->addWidget(kind);
  head->addStretch(1);
  head->addWidget(status);
  v->addLayout(head);
  if (d.present) {
    auto* name = new QLabel(d.name, f);
    name->setWordWrap(true);
    v->addWidget(name);
  } else {
    auto* why =
        new QLabel(QObject::tr("%1: %2. The grid shows it, disabled.").arg(d.kind, d.status), f);
    why->setObjectName(QStringLiteral("Muted"));
    why->setWordWrap(true);
    v->addWidget(why);
  }
  for (const QString& line : d.details) {
    auto* l = new QLabel(line, f);
    l->setObjectName(QStringLiteral("Muted"));
    l->setWordWrap(true);
    l->setTextInteractionFlags(Qt::TextSelectableByMouse);
    v->addWidget(l);
  }
  if (d.memTotal > 0 && d.memAvailable <= 0 && d.present) {
    auto* mem = new QLabel(QObject::tr("Memory: %1").arg(formatBytes(d.memTotal)), f);
    mem->setObjectName(QStringLiteral("Muted"));
    v->addWidget(mem);
  } else if (d.memTotal > 0 && d.memAvailable > 0) {
    const qint64 used = d.memTotal - d.memAvailable;
    auto* mem = new QLabel(QObject::tr("Memory: %1 free of %2")
                               .arg(formatBytes(d.memAvailable), formatBytes(d.memTotal)),
                           f);
    mem->setObjectName(QStringLiteral("Muted"));
    auto* bar = new QProgressBar(f);
    bar->setRange(0, 1000);
    bar->setValue(static_cast<int>(used * 1000 / d.memTotal));
    bar->setTextVisible(false);
    bar->setFixedHeight(8);
    bar->setStyleSheet(QStringLiteral("QProgressBar::chunk{background:%1;border-radius:4px;}")
                           .arg(theme::css(d.color)));
    v->addWidget(mem);
    v->addWidget(bar);
  }
  return f;
}

}  // namespace

EnginePanel::EnginePanel(PlacementModel* placement, PresetListModel* presets,
                         std::shared_ptr<LiveStats> stats, QWidget* parent)
    : QTabWidget(parent) {
  setObjectName(QStringLiteral("RightPanel"));
  setDocumentMode(true);
  m_placement = new PlacementPanel(placement, presets, stats, this);
  m_placement->setObjectName(QStringLiteral("RightPanel"));
  m_charts = new ChartsPanel(std::move(stats), this);
  m_chatSettings = new ChatSettingsPanel;
  m_devices = new QWidget;
  m_deviceList = new QVBoxLayout(m_devices);
  m_deviceList->setContentsMargins(16, 16, 16, 16);
  m_deviceList->setSpacing(10);
  // Scrolls when the window is shorter than the strategy, the grid (eight
  // rows at least) and the cost together.
  addTab(scrolled(m_placement, this), tr("Placement"));
  addTab(m_charts, tr("Performance"));
  addTab(scrolled(m_devices, this), tr("Devices"));
  addTab(scrolled(m_chatSettings, this), tr("Chat"));
  setTabToolTip(ChatTab, tr("The chat's settings: sampling, length, context"));
  m_server = new ServerPanel;
  addTab(scrolled(m_server, this), tr("Server"));
}

void EnginePanel::setDevices(const QVector<DeviceInfo>& devices) {
  while (QLayoutItem* li = m_deviceList->takeAt(0)) {
    delete li->widget();
    delete li;
  }
  for (const DeviceInfo& d : devices) m_deviceList->addWidget(deviceCard(d, m_devices));
  auto* note = new QLabel(
      tr("Memory tiers: GPU memory for the weights and KV cache placed there, host RAM for "
         "the rest, and an SSD spill file for the KV cache of long contexts: when a context's "
         "KV would take more than half the free memory, older, little-attended blocks go to "
         "%1 (loom run --kv-ram sets the budget by hand).")
          .arg(QString::fromStdString(loom::default_kv_spill_dir())),
      m_devices);
  note->setObjectName(QStringLiteral("Muted"));
  note->setWordWrap(true);
  m_deviceList->addWidget(note);
  m_deviceList->addStretch(1);
}

QStringList EnginePanel::deviceStatuses() const {
  QStringList out;
  for (const QFrame* card : m_devices->findChildren<QFrame*>(QStringLiteral("Card"))) {
    const auto* kind = card->findChild<QLabel*>(QStringLiteral("CardTitle"));
    const auto* status = card->findChild<QLabel*>(QStringLiteral("DeviceStatus"));
    if (kind && status) out << QStringLiteral("%1: %2").arg(kind->text(), status->text());
  }
  return out;
}
