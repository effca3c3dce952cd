#include "app/charts_panel.h"

#include <QAreaSeries>
#include <QBarCategoryAxis>
#include <QBarSeries>
#include <QBarSet>
#include <QCategoryAxis>
#include <QChart>
#include <QChartView>
#include <QFrame>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineSeries>
#include <QLogValueAxis>
#include <QResizeEvent>
#include <QScrollArea>
#include <QStackedBarSeries>
#include <QTimer>
#include <QVBoxLayout>
#include <QValueAxis>
#include <algorithm>
#include <cmath>

#include "app/theme.h"

namespace {

using Hist = loom::LatencyHistogram;

// Titles and legends live in the card's header (a QLabel): the plot keeps the height.
QChart* makeChart() {
  auto* c = new QChart;
  c->setAnimationOptions(QChart::NoAnimation);  // redrawn 4x a second: animation would only lag
  c->setBackgroundRoundness(0);
  c->setBackgroundBrush(Qt::white);
  c->setMargins(QMargins(2, 4, 8, 0));
  c->legend()->hide();
  return c;
}

QString swatch(const QColor& c, const QString& text) {
  return QStringLiteral("<span style='color:%1'>■</span>&nbsp;%2")
      .arg(theme::css(c), text.toHtmlEscaped());
}

void styleAxis(QAbstractAxis* a, const QString& title = {}) {
  a->setLabelsFont(theme::uiFont(8));
  a->setLabelsColor(theme::kMuted);
  a->setGridLineColor(QColor(0xee, 0xf0, 0xf3));
  a->setLinePenColor(theme::kBorder);
  if (!title.isEmpty()) {
    a->setTitleText(title);
    a->setTitleFont(theme::uiFont(8));
    a->setTitleBrush(theme::kMuted);
  }
}

QChartView* makeView(QChart* chart, int minHeight, QWidget* parent) {
  auto* v = new QChartView(chart, parent);
  v->setRenderHint(QPainter::Antialiasing);
  v->setMinimumHeight(minHeight);
  v->setFrameShape(QFrame::NoFrame);
  return v;
}

QFrame* framed(QWidget* inner, const QString& title, QLabel* legend, QWidget* parent) {
  auto* f = new QFrame(parent);
  f->setObjectName(QStringLiteral("Card"));
  auto* l = new QVBoxLayout(f);
  l->setContentsMargins(12, 10, 10, 6);
  l->setSpacing(2);
  auto* head = new QHBoxLayout;
  auto* t = new QLabel(title, f);
  t->setObjectName(QStringLiteral("CardTitle"));
  head->addWidget(t);
  head->addStretch(1);
  if (legend) {
    legend->setParent(f);
    legend->setObjectName(QStringLiteral("StatLabel"));
    // Wraps in a narrow panel rather than widening the card past it.
    legend->setWordWrap(true);
    legend->setAlignment(Qt::AlignRight | Qt::AlignVCenter);
    head->addWidget(legend, 1);
  }
  l->addLayout(head);
  l->addWidget(inner);
  return f;
}

QString msText(double ms) {
  if (ms <= 0) return QStringLiteral("—");
  if (ms < 1) return QStringLiteral("%1 µs").arg(ms * 1000.0, 0, 'f', 0);
  if (ms < 100) return QStringLiteral("%1 ms").arg(ms, 0, 'f', ms < 10 ? 2 : 1);
  return QStringLiteral("%1 ms").arg(ms, 0, 'f', 0);
}

QLabel* tile(QGridLayout* grid, int col, const QString& label, QWidget* parent,
             const QString& tip) {
  auto* f = new QFrame(parent);
  f->setObjectName(QStringLiteral("Card"));
  f->setToolTip(tip);
  auto* v = new QVBoxLayout(f);
  v->setContentsMargins(12, 8, 12, 8);
  v->setSpacing(0);
  auto* value = new QLabel(QStringLiteral("—"), f);
  value->setObjectName(QStringLiteral("StatValue"));
  auto* l = new QLabel(label, f);
  l->setObjectName(QStringLiteral("StatLabel"));
  l->setWordWrap(true);  // "P99 token interval" in a quarter of the panel
  v->addWidget(value);
  v->addWidget(l);
  grid->addWidget(f, 0, col);
  return value;
}

// Makes Qt Charts measure an axis's labels again. A new range does not (6.4
// caches the axis's size hint until the tick count or format changes), so
// labels that grew wider would be elided to "...".
void remeasure(QValueAxis* axis) {
  const int n = axis->tickCount();
  axis->setTickCount(n + 1);
  axis->setTickCount(n);
}

// [0, v] widened to a round number, with 3 to 5 ticks at a round step
// (1, 2 or 5 times a power of ten) and labels with just enough decimals.
// (More ticks do not fit the charts' height: Qt Charts elides labels that
// touch their neighbours.)
void setNiceRange(QValueAxis* axis, double v, const QString& suffix = {}) {
  if (!(v > 0)) v = 1;
  const double raw = v / 4.0;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * p;
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * p >= raw) {
      step = m * p;
      break;
    }
  }
  const double top = std::ceil(v / step - 1e-9) * step;
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  const QString format =
      QStringLiteral("%.") + QString::number(decimals) + QStringLiteral("f") + suffix;
  axis->setRange(0, top);
  axis->setTickCount(static_cast<int>(std::lround(top / step)) + 1);
  axis->setLabelFormat(format);
  // The widest label is the top one: measure again when it changed.
  const QString widest = QString::asprintf(format.toUtf8().constData(), top);
  if (axis->property("loomWidest").toString() != widest) {
    axis->setProperty("loomWidest", widest);
    remeasure(axis);
  }
}

// x in [lo, hi] = log10(ms), labelled at round values: 1-2-5 per decade, finer
// when the range is narrow.
void setLogMsAxis(QCategoryAxis* axis, double lo, double hi) {
  if (!(hi > lo)) hi = lo + 1;
  for (const QString& l : axis->categoriesLabels()) axis->remove(l);
  const double span = hi - lo;
  QList<double> mantissas{1, 2, 5};
  if (span < 0.8)
    mantissas = {1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8};
  else if (span < 1.6)
    mantissas = {1, 1.5, 2, 3, 5, 7};
  else if (span > 3.5)
    mantissas = {1};
  axis->setStartValue(lo);
  for (int d = static_cast<int>(std::floor(lo)); d <= static_cast<int>(std::ceil(hi)); ++d) {
    for (double m : mantissas) {
      const double v = m * std::pow(10.0, d);
      const double x = std::log10(v);
      if (x < lo || x > hi) continue;
      axis->append(QString::number(v, 'g', 3), x);
    }
  }
  axis->setRange(lo, hi);
}

}  // namespace

ChartsPanel::ChartsPanel(std::shared_ptr<LiveStats> stats, QWidget* parent)
    : QWidget(parent), m_stats(std::move(stats)) {
  auto* outer = new QVBoxLayout(this);
  outer->setContentsMargins(0, 0, 0, 0);
  auto* scroll = new QScrollArea(this);
  scroll->setWidgetResizable(true);
  scroll->setFrameShape(QFrame::NoFrame);
  scroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  outer->addWidget(scroll);
  auto* content = new QWidget;
  content->setObjectName(QStringLiteral("RightPanel"));
  scroll->setWidget(content);
  auto* v = new QVBoxLayout(content);
  v->setContentsMargins(16, 16, 16, 16);
  v->setSpacing(8);

  auto* tiles = new QGridLayout;
  tiles->setSpacing(8);
  m_ttft = tile(tiles, 0, tr("first token"), content,
                tr("Time to first token of the last reply (prompt evaluation)"));
  m_tps = tile(tiles, 1, tr("tokens / s"), content,
               tr("Decode speed: of the latest ¼ s while a reply streams, of the whole last "
                  "reply once it ends"));
  // The inter-token interval: from one token's text reaching the app to the
  // next one's (the decode step plus sampling and detokenizing). Not the
  // decode step alone: that is the Placement tab's "decode step" figure.
  m_p50 = tile(tiles, 2, tr("P50 token interval"), content,
               tr("Median inter-token interval: the time from one token's text to the next, "
                  "every reply since the last Apply. It includes the decode step (Placement "
                  "tab), sampling and detokenizing. Counted per piece of text: a token whose "
                  "bytes are held back (part of a character) adds no interval."));
  m_p99 = tile(tiles, 3, tr("P99 token interval"), content,
               tr("99th percentile of the inter-token interval (the time from one token's text "
                  "to the next)"));
  v->addLayout(tiles);
  m_tiles = tiles;

  // Inter-token latency histogram. Latencies span decades (a 0.1 ms decode
  // step next to a 30 ms stall), so x is log10(ms), labelled at 1-2-5 values
  // (QLogValueAxis labels only powers of ten: too few within one decade).
  m_histChart = makeChart();
  m_histUpper = new QLineSeries;
  m_histArea = new QAreaSeries(m_histUpper);
  m_histArea->setName(tr("tokens"));
  QColor fill = theme::kAccent;
  fill.setAlphaF(0.25f);
  m_histArea->setBrush(fill);
  m_histArea->setPen(QPen(theme::kAccent, 1.2));
  m_p50Line = new QLineSeries;
  m_p50Line->setPen(QPen(theme::kP50, 2, Qt::DashLine));
  m_p50Line->setName(tr("P50"));
  m_p99Line = new QLineSeries;
  m_p99Line->setPen(QPen(theme::kP99, 2, Qt::DashLine));
  m_p99Line->setName(tr("P99"));
  m_histChart->addSeries(m_histArea);
  m_histChart->addSeries(m_p50Line);
  m_histChart->addSeries(m_p99Line);
  m_histX = new QCategoryAxis;
  m_histX->setLabelsPosition(QCategoryAxis::AxisLabelsPositionOnValue);
  styleAxis(m_histX, tr("ms between tokens (log scale)"));
  m_histY = new QValueAxis;
  m_histY->setLabelFormat(QStringLiteral("%d"));
  styleAxis(m_histY);
  m_histChart->addAxis(m_histX, Qt::AlignBottom);
  m_histChart->addAxis(m_histY, Qt::AlignLeft);
  for (QAbstractSeries* s :
       {static_cast<QAbstractSeries*>(m_histArea), static_cast<QAbstractSeries*>(m_p50Line),
        static_cast<QAbstractSeries*>(m_p99Line)}) {
    s->attachAxis(m_histX);
    s->attachAxis(m_histY);
  }
  m_histLegend = new QLabel;
  v->addWidget(framed(makeView(m_histChart, 150, content), tr("Inter-token interval"), m_histLegend,
                      content));

  // Per-layer decode time (the profiler's whole-layer figures).
  m_layerChart = makeChart();
  m_layerP50 = new QBarSet(tr("P50"));
  m_layerP50->setColor(theme::kP50);
  m_layerP50->setBorderColor(theme::kP50);
  m_layerP99 = new QBarSet(tr("P99"));
  m_layerP99->setColor(theme::kP99);
  m_layerP99->setBorderColor(theme::kP99);
  m_layerSeries = new QBarSeries;
  m_layerSeries->append(m_layerP50);
  m_layerSeries->append(m_layerP99);
  m_layerSeries->setBarWidth(0.8);
  m_layerChart->addSeries(m_layerSeries);
  m_layerX = new QBarCategoryAxis;
  styleAxis(m_layerX);
  // Log scale: a decode step's P50 and a stall's P99 can be 1000x apart, and
  // on a linear axis the P50 bars would vanish.
  m_layerY = new QLogValueAxis;
  m_layerY->setBase(10);
  m_layerY->setLabelFormat(QStringLiteral("%g"));
  m_layerY->setMinorTickCount(0);
  styleAxis(m_layerY);
  m_layerChart->addAxis(m_layerX, Qt::AlignBottom);
  m_layerChart->addAxis(m_layerY, Qt::AlignLeft);
  m_layerSeries->attachAxis(m_layerX);
  m_layerSeries->attachAxis(m_layerY);
  m_layerLegend = new QLabel;
  v->addWidget(framed(makeView(m_layerChart, 150, content), tr("Per-layer decode time"),
                      m_layerLegend, content));

  // Tokens/s over generation time.
  m_tpsChart = makeChart();
  m_tpsSeries = new QLineSeries;
  m_tpsSeries->setName(tr("decode speed, ¼ s windows"));
  m_tpsSeries->setPen(QPen(theme::kCpu, 2));
  m_tpsChart->addSeries(m_tpsSeries);
  m_tpsX = new QValueAxis;
  m_tpsX->setLabelFormat(QStringLiteral("%.0f"));
  styleAxis(m_tpsX);
  m_tpsY = new QValueAxis;
  m_tpsY->setLabelFormat(QStringLiteral("%.0f"));
  styleAxis(m_tpsY);
  m_tpsChart->addAxis(m_tpsX, Qt::AlignBottom);
  m_tpsChart->addAxis(m_tpsY, Qt::AlignLeft);
  m_tpsSeries->attachAxis(m_tpsX);
  m_tpsSeries->attachAxis(m_tpsY);
  // Placement changes (the adaptive auto's tries, the user's applies) as
  // vertical dashed lines: one series drawn as a comb along the x axis.
  m_tpsMarks = new QLineSeries;
  m_tpsMarks->setName(tr("placement changes"));
  m_tpsMarks->setPen(QPen(theme::kAccent, 1.2, Qt::DashLine));
  m_tpsChart->addSeries(m_tpsMarks);
  m_tpsMarks->attachAxis(m_tpsX);
  m_tpsMarks->attachAxis(m_tpsY);
  m_tpsX->setRange(0, 10);
  m_tpsY->setRange(0, 10);
  m_tpsLegend = new QLabel(tr("per ¼ s or 32 tokens · idle time left out"));
  v->addWidget(
      framed(makeView(m_tpsChart, 130, content), tr("Tokens per second"), m_tpsLegend, content));

  // Memory per tier.
  m_memChart = makeChart();
  m_memWeights = new QBarSet(tr("weights"));
  m_memWeights->setColor(theme::kTierRam);
  m_memWeights->setBorderColor(theme::kTierRam);
  m_memKv = new QBarSet(tr("KV cache"));
  QColor kv = theme::kTierRam.lighter(150);
  m_memKv->setColor(kv);
  m_memKv->setBorderColor(kv);
  // Vertical bars: Qt Charts elides the category labels of a vertical category axis.
  auto* memSeries = new QStackedBarSeries;
  memSeries->append(m_memWeights);
  memSeries->append(m_memKv);
  memSeries->setBarWidth(0.45);
  m_memChart->addSeries(memSeries);
  m_memCats = new QBarCategoryAxis;
  // The longest labels first: the axis sizes its label column once, and
  // elides labels that later grow.
  m_memCats->append({tr("GPU (none)"), tr("RAM"), tr("SSD (off)")});
  styleAxis(m_memCats);
  m_memAxis = new QValueAxis;
  m_memAxis->setLabelFormat(QStringLiteral("%.0f"));
  styleAxis(m_memAxis);
  m_memAxis->setLabelFormat(QStringLiteral("%.0f MiB"));
  m_memChart->addAxis(m_memCats, Qt::AlignBottom);
  m_memChart->addAxis(m_memAxis, Qt::AlignLeft);
  memSeries->attachAxis(m_memCats);
  memSeries->attachAxis(m_memAxis);
  auto* memLegend =
      new QLabel(swatch(theme::kTierRam, tr("weights")) + QStringLiteral("&nbsp;&nbsp; ") +
                 swatch(theme::kTierRam.lighter(150), tr("KV cache")));
  v->addWidget(
      framed(makeView(m_memChart, 140, content), tr("Memory in use by tier"), memLegend, content));
  v->addStretch(1);

  m_timer = new QTimer(this);
  m_timer->setInterval(250);
  connect(m_timer, &QTimer::timeout, this, [this] {
    if (m_stats->version() != m_shown.version) refresh();
  });
  m_timer->start();
  refresh();
}

ChartsPanel::~ChartsPanel() = default;

void ChartsPanel::resizeEvent(QResizeEvent* event) {
  QWidget::resizeEvent(event);
  // Four tiles in a row where they fit, two by two in a narrow panel (a
  // row of four would be wider than the panel, and cut on the right).
  const int columns = width() >= kTilesInOneRowWidth ? 4 : 2;
  if (columns == m_tileColumns) return;
  m_tileColumns = columns;
  QList<QWidget*> items;
  while (QLayoutItem* li = m_tiles->takeAt(0)) {
    items << li->widget();
    delete li;
  }
  for (int i = 0; i < items.size(); ++i) m_tiles->addWidget(items[i], i / columns, i % columns);
}

void ChartsPanel::showEvent(QShowEvent* event) {
  QWidget::showEvent(event);
  // A chart first laid out while its tab was hidden can keep label columns
  // too narrow; once shown, every axis measures its labels again.
  QTimer::singleShot(0, this, &ChartsPanel::relayoutAxes);
}

void ChartsPanel::relayoutAxes() {
  for (QChart* c : {m_histChart, m_layerChart, m_tpsChart, m_memChart}) {
    for (QAbstractAxis* a : c->axes()) {
      if (auto* v = qobject_cast<QValueAxis*>(a)) remeasure(v);
      if (auto* l = qobject_cast<QLogValueAxis*>(a)) {
        const QString f = l->labelFormat();
        l->setLabelFormat(f + QLatin1Char(' '));
        l->setLabelFormat(f);
      }
    }
  }
}

void ChartsPanel::refresh() {
  const LiveSnapshot s = m_stats->snapshot();
  buildTiles(s);
  buildHistogram(s);
  buildLayers(s);
  buildTps(s);
  buildMemory(s);
  m_shown.version = s.version;
}

void ChartsPanel::buildTiles(const LiveSnapshot& s) {
  m_ttft->setText(msText(s.lastTtftMs));
  // While a reply streams: the speed of its latest window (¼ s or 32 tokens),
  // not "—" or the previous reply's figure; once it ends, the reply's average.
  double tps = s.lastTokensPerSecond;
  if (s.generating && !s.tokensPerSecond.empty()) tps = s.tokensPerSecond.back().second;
  m_shown.tokensPerSecond = tps;
  m_tps->setText(tps > 0 ? QString::number(tps, 'f', tps < 100 ? 1 : 0) : QStringLiteral("—"));
  m_shown.itlSamples = s.itl.count;
  m_shown.p50Ms = s.itl.percentile_ms(0.50);
  m_shown.p99Ms = s.itl.percentile_ms(0.99);
  m_p50->setText(msText(m_shown.p50Ms));
  m_p99->setText(msText(m_shown.p99Ms));
  m_p50->setStyleSheet(QStringLiteral("color:%1;").arg(theme::css(theme::kP50)));
  m_p99->setStyleSheet(QStringLiteral("color:%1;").arg(theme::css(theme::kP99)));
}

void ChartsPanel::buildHistogram(const LiveSnapshot& s) {
  int first = -1, last = -1;
  uint64_t peak = 0;
  for (int b = 0; b < Hist::kBuckets; ++b) {
    const uint64_t c = s.itl.counts[static_cast<size_t>(b)];
    if (c == 0) continue;
    if (first < 0) first = b;
    last = b;
    peak = std::max(peak, c);
  }
  QList<QPointF> pts;
  if (first < 0) {
    m_histUpper->clear();
    m_p50Line->clear();
    m_p99Line->clear();
    setLogMsAxis(m_histX, -1, 1);
    setNiceRange(m_histY, 1);
    m_histLegend->setText(tr("no tokens yet"));
    return;
  }
  // From a few empty buckets below the first to the last, as steps: (lo, c) -> (hi, c).
  const int lo = std::max(0, first - 3), hi = last;
  for (int b = lo; b <= hi; ++b) {
    const double x0 = std::log10(Hist::bucket_lower_ns(b) * 1e-6),
                 x1 = std::log10(Hist::bucket_lower_ns(b + 1) * 1e-6);
    const auto c = static_cast<double>(s.itl.counts[static_cast<size_t>(b)]);
    pts << QPointF(x0, c) << QPointF(x1, c);
  }
  m_histUpper->replace(pts);
  setLogMsAxis(m_histX, std::log10(Hist::bucket_lower_ns(lo) * 1e-6),
               std::log10(Hist::bucket_lower_ns(std::min(Hist::kBuckets, last + 2)) * 1e-6));
  setNiceRange(m_histY, static_cast<double>(peak) * 1.1);
  const double yMax = m_histY->max();
  const double p50 = s.itl.percentile_ms(0.50), p99 = s.itl.percentile_ms(0.99);
  m_p50Line->replace({QPointF(std::log10(p50), 0), QPointF(std::log10(p50), yMax)});
  m_p99Line->replace({QPointF(std::log10(p99), 0), QPointF(std::log10(p99), yMax)});
  m_histLegend->setText(
      swatch(theme::kP50, tr("P50 %1").arg(msText(p50))) + QStringLiteral("&nbsp;&nbsp; ") +
      swatch(theme::kP99, tr("P99 %1").arg(msText(p99))) + QStringLiteral("&nbsp;&nbsp; ") +
      (s.itl.count == 1 ? tr("1 interval") : tr("%1 intervals (every token)").arg(s.itl.count)));
}

void ChartsPanel::buildLayers(const LiveSnapshot& s) {
  const int n = static_cast<int>(s.layers.size());
  if (n != m_layerCount) {
    m_layerCount = n;
    QStringList cats;
    // Large models: label every few layers so the numbers stay readable.
    const int step = n > 48 ? 8 : n > 24 ? 4 : n > 12 ? 2 : 1;
    for (int l = 0; l < n; ++l)
      cats << (l % step == 0 ? QString::number(l) : QString(l, QLatin1Char(' ')));
    m_layerX->clear();
    m_layerX->append(cats);
  }
  double maxMs = 0;
  int withData = 0;
  for (const auto& l : s.layers) {
    maxMs = std::max(maxMs, l.p99_ms);
    if (l.count > 0) ++withData;
  }
  // µs for fast layers (small models), ms otherwise.
  const bool micro = maxMs < 1.0;
  const double k = micro ? 1000.0 : 1.0;
  double minPositive = 0;
  for (const auto& l : s.layers) {
    for (double v : {l.p50_ms * k, l.p99_ms * k}) {
      if (v > 0 && (minPositive == 0 || v < minPositive)) minPositive = v;
    }
  }
  // Whole decades, at least one; an empty layer draws as a zero-height bar at the bottom.
  const double lo = minPositive > 0 ? std::pow(10.0, std::floor(std::log10(minPositive))) : 1.0;
  double hi = maxMs > 0 ? std::pow(10.0, std::ceil(std::log10(maxMs * k * 1.05))) : 10.0;
  if (hi <= lo) hi = lo * 10;
  QList<qreal> p50, p99;
  for (const auto& l : s.layers) {
    p50 << std::max(l.p50_ms * k, lo);
    p99 << std::max(l.p99_ms * k, lo);
  }
  // Every value the log axis sees must be > 0. Between `remove` and
  // `append` on one set the other set's missing values read as 0 ("Logarithms
  // of zero and negative values are undefined."), so the same number of layers
  // is updated in place, and a new number with the series out of the chart.
  if (m_layerP50->count() == p50.size() && m_layerP99->count() == p99.size()) {
    for (int i = 0; i < p50.size(); ++i) {
      if (m_layerP50->at(i) != p50[i]) m_layerP50->replace(i, p50[i]);
      if (m_layerP99->at(i) != p99[i]) m_layerP99->replace(i, p99[i]);
    }
  } else {
    m_layerChart->removeSeries(m_layerSeries);
    m_layerP50->remove(0, m_layerP50->count());
    m_layerP99->remove(0, m_layerP99->count());
    m_layerP50->append(p50);
    m_layerP99->append(p99);
    m_layerChart->addSeries(m_layerSeries);
    m_layerSeries->attachAxis(m_layerX);
    m_layerSeries->attachAxis(m_layerY);
  }
  if (m_layerY->min() != lo || m_layerY->max() != hi) {
    m_layerY->setRange(lo, hi);
    // Labels may have grown wider ("1000"): make Qt Charts measure them again.
    m_layerY->setLabelFormat(QStringLiteral("%g "));
    m_layerY->setLabelFormat(QStringLiteral("%g"));
  }
  // The unit goes in the header (Qt Charts formats labels through Latin-1: no "µ" there).
  // How many decode steps the figures rest on: with the GPU in the placement
  // the profiler times one step in eight (Profiler::sample_every).
  uint64_t steps = 0;
  for (const auto& l : s.layers) steps = std::max<uint64_t>(steps, l.count);
  m_layerLegend->setText(swatch(theme::kP50, tr("P50")) + QStringLiteral("&nbsp;&nbsp; ") +
                         swatch(theme::kP99, tr("P99")) + QStringLiteral("&nbsp;&nbsp; ") +
                         (micro ? tr("µs, log scale") : tr("ms, log scale")) +
                         QStringLiteral("&nbsp;&nbsp; ") +
                         tr("%n step(s) timed", nullptr, static_cast<int>(steps)));
  m_shown.layersWithData = withData;
}

void ChartsPanel::buildTps(const LiveSnapshot& s) {
  QList<QPointF> pts;
  double maxY = 0, maxX = 0;
  for (const auto& [t, tps] : s.tokensPerSecond) {
    pts << QPointF(t, tps);
    maxY = std::max(maxY, tps);
    maxX = std::max(maxX, t);
  }
  m_tpsSeries->replace(pts);
  // The last two minutes of generation at most.
  const double span = 120.0;
  setNiceRange(m_tpsX, std::max(maxX, 0.01), QStringLiteral(" s"));
  if (maxX > span) m_tpsX->setRange(maxX - span, maxX);
  setNiceRange(m_tpsY, maxY * 1.15);
  m_shown.tpsPoints = static_cast<int>(pts.size());

  // Each change: up to the top and back down; the stretches between run along the axis.
  QList<QPointF> comb;
  const double top = m_tpsY->max();
  for (const auto& [t, what] : s.placementMarks) {
    comb << QPointF(t, 0) << QPointF(t, top) << QPointF(t, 0);
  }
  m_tpsMarks->replace(comb);
  m_shown.placementMarks = static_cast<int>(s.placementMarks.size());
  QString legend = tr("per ¼ s or 32 tokens · idle time left out");
  QString tip;
  if (!s.placementMarks.empty()) {
    const auto& [t, what] = s.placementMarks.back();
    legend += tr(" · ┆ placement changes: %1 (last at %2 s: %3)")
                  .arg(s.placementMarks.size())
                  .arg(t, 0, 'f', 1)
                  .arg(QString::fromStdString(what));
    const size_t first = s.placementMarks.size() > 12 ? s.placementMarks.size() - 12 : 0;
    for (size_t i = first; i < s.placementMarks.size(); ++i) {
      tip += QStringLiteral("%1 s  %2\n")
                 .arg(s.placementMarks[i].first, 0, 'f', 1)
                 .arg(QString::fromStdString(s.placementMarks[i].second));
    }
  }
  m_tpsLegend->setText(legend);
  m_tpsLegend->setToolTip(tip.trimmed());
}

void ChartsPanel::buildMemory(const LiveSnapshot& s) {
  const double mib = 1024.0 * 1024.0;
  m_memWeights->remove(0, m_memWeights->count());
  m_memKv->remove(0, m_memKv->count());
  m_memWeights->append({static_cast<qreal>(s.gpu.weights) / mib,
                        static_cast<qreal>(s.ram.weights) / mib,
                        static_cast<qreal>(s.ssd.weights) / mib});
  m_memKv->append({static_cast<qreal>(s.gpu.kv) / mib, static_cast<qreal>(s.ram.kv) / mib,
                   static_cast<qreal>(s.ssd.kv) / mib});
  const QStringList cats{s.gpuPresent ? tr("GPU") : tr("GPU (none)"), tr("RAM"),
                         s.ssdPresent ? tr("SSD") : tr("SSD (off)")};
  if (m_memCats->categories() != cats) {
    m_memCats->clear();
    m_memCats->append(cats);
  }
  const uint64_t top =
      std::max({s.gpu.weights + s.gpu.kv, s.ram.weights + s.ram.kv, s.ssd.weights + s.ssd.kv});
  const double topMib = static_cast<double>(top) / mib;
  setNiceRange(m_memAxis, topMib * 1.1, QStringLiteral(" MiB"));
  m_shown.ramBytes = s.ram.weights + s.ram.kv;
  m_shown.gpuBytes = s.gpu.weights + s.gpu.kv;
  m_shown.gpuPresent = s.gpuPresent;
}
