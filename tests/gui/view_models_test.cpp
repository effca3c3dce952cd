// The app's models and small pieces, without the engine: chat list over the
// store, the placement grid's model, devices and strategies, live stats,
// Markdown splitting and rendering, the command line.
#include <gtest/gtest.h>

#include <QColor>
#include <QDir>
#include <QTest>
#include <QTextBlock>
#include <QTextDocument>
#include <QTextFrame>
#include <algorithm>

#include "app/app_options.h"
#include "app/chat_list_model.h"
#include "app/device_info.h"
#include "app/live_stats.h"
#include "app/markdown_view.h"
#include "app/placement_model.h"
#include "app/theme.h"
#include "tests/gui/gui_test_util.h"

namespace {

// ---- chat list ------------------------------------------------------------------

TEST(ChatListModel, CreateRenameSearchDelete) {
  auto store = loom::storage::Store::open(guitest::freshDir("chatlist").toStdString() + "/loom.db");
  ASSERT_TRUE(store.ok()) << store.message();
  ChatListModel m(store->get());
  EXPECT_EQ(m.rowCount(), 0);
  QString err;
  const qint64 a = m.createChat(QStringLiteral("Rust lifetimes"), {}, &err);
  const qint64 b = m.createChat(QStringLiteral("Bread"), {}, &err);
  ASSERT_TRUE(a && b) << err.toStdString();
  ASSERT_EQ(m.rowCount(), 2);
  EXPECT_EQ(m.chatIdAt(0), b);  // newest first
  EXPECT_EQ(m.data(m.index(0), Qt::DisplayRole).toString(), QStringLiteral("Bread"));
  EXPECT_EQ(m.data(m.index(0), ChatListModel::ChatIdRole).toLongLong(), b);
  EXPECT_TRUE(m.flags(m.index(0)) & Qt::ItemIsEditable);

  // Inline rename goes to the store; an empty name is refused.
  EXPECT_TRUE(m.setData(m.index(m.rowOf(a)), QStringLiteral("Borrowing"), Qt::EditRole));
  EXPECT_FALSE(m.setData(m.index(0), QStringLiteral("   "), Qt::EditRole));
  EXPECT_EQ(QString::fromStdString((*store)->get_chat(a)->title), QStringLiteral("Borrowing"));
  EXPECT_EQ(m.chatIdAt(0), a);  // renamed: now the latest change

  ASSERT_TRUE((*store)->add_message(b, "user", "sourdough starter").ok());
  m.setSearch(QStringLiteral("sourdough"));
  ASSERT_EQ(m.rowCount(), 1);
  EXPECT_EQ(m.chatIdAt(0), b);
  m.setSearch(QString());
  EXPECT_EQ(m.rowCount(), 2);

  EXPECT_TRUE(m.deleteChat(b, &err));
  EXPECT_EQ(m.rowCount(), 1);
  EXPECT_EQ(m.rowOf(b), -1);
  EXPECT_FALSE(m.deleteChat(b, &err));
  EXPECT_TRUE(err.contains(QStringLiteral("no chat with id"))) << err.toStdString();
}

// ---- placement grid ---------------------------------------------------------------

ModelSummary threeLayers() {
  ModelSummary m;
  m.name = QStringLiteral("t");
  m.nLayer = 3;
  m.nHeadKv = 2;
  m.headDim = 32;
  for (int l = 0; l < 3; ++l) {
    m.attnWeights << TensorGroupInfo{
        QStringLiteral("Q4_K"), 1000, {QStringLiteral("blk.%1.attn_q.weight").arg(l)}};
    m.ffnWeights << TensorGroupInfo{QStringLiteral("Q4_K + Q6_K"), 3000, {}};
    m.norms << TensorGroupInfo{QStringLiteral("F32"), 10, {}};
  }
  m.embedding = TensorGroupInfo{QStringLiteral("Q8_0"), 500, {}};
  m.output = TensorGroupInfo{QStringLiteral("Q6_K"), 600, {}};
  return m;
}

QVector<BackendInfo> cpuAndGpu(bool gpuAvailable) {
  return {
      BackendInfo{QStringLiteral("cpu"), QStringLiteral("CPU"), theme::kCpu, true, {}},
      BackendInfo{QStringLiteral("vulkan:0"), QStringLiteral("GPU"), theme::kVulkan, gpuAvailable,
                  gpuAvailable ? QString() : QStringLiteral("Vulkan: not built")}};
}

TEST(PlacementModel, GridFromTheModelAllOnCpu) {
  PlacementModel pm;
  pm.setBackends(cpuAndGpu(false));
  const PlacementPlan plan =
      PlacementPlan::allOn(QStringLiteral("cpu"), threeLayers(), QStringLiteral("F16"),
                           {QStringLiteral("F16"), QStringLiteral("Q8_0")}, QStringLiteral("note"));
  pm.setApplied(plan);
  ASSERT_EQ(pm.rowCount(), 5);           // embedding, 3 layers, output
  EXPECT_EQ(pm.columnCount(), kColAll);  // op groups, the timing column, error and outliers
  EXPECT_EQ(pm.headerData(0, Qt::Vertical, Qt::DisplayRole).toString(),
            QStringLiteral("Embedding"));
  EXPECT_EQ(pm.headerData(2, Qt::Vertical, Qt::DisplayRole).toString(), QStringLiteral("Layer 1"));
  EXPECT_EQ(pm.headerData(4, Qt::Vertical, Qt::DisplayRole).toString(), QStringLiteral("Output"));
  // The unit and the real weight format as text, the backend's colour.
  EXPECT_EQ(pm.data(pm.index(1, kColAttnWeights), Qt::DisplayRole).toString(),
            QStringLiteral("CPU Q4_K"));
  EXPECT_EQ(pm.data(pm.index(1, kColAttnWeights), PlacementModel::PrecisionRole).toString(),
            QStringLiteral("Q4_K"));
  EXPECT_EQ(pm.data(pm.index(1, kColFfnWeights), PlacementModel::PrecisionRole).toString(),
            QStringLiteral("Q4_K + Q6_K"));
  EXPECT_EQ(pm.data(pm.index(2, kColAttnKv), Qt::DisplayRole).toString(),
            QStringLiteral("CPU F16"));
  EXPECT_EQ(pm.data(pm.index(0, 0), Qt::DisplayRole).toString(), QStringLiteral("CPU Q8_0"));
  EXPECT_EQ(pm.data(pm.index(1, 0), PlacementModel::BackendColorRole).value<QColor>(), theme::kCpu);
  EXPECT_EQ(pm.data(pm.index(1, 0), PlacementModel::BackendLabelRole).toString(),
            QStringLiteral("CPU"));
  EXPECT_TRUE(pm.data(pm.index(1, 0), Qt::ToolTipRole)
                  .toString()
                  .contains(QStringLiteral("blk.0.attn_q.weight")));
  // Edge rows have one cell.
  EXPECT_TRUE(pm.flags(pm.index(0, 0)) & Qt::ItemIsEnabled);
  EXPECT_EQ(pm.flags(pm.index(0, 1)), Qt::NoItemFlags);
  EXPECT_FALSE(pm.flags(pm.index(1, kColTiming)) & Qt::ItemIsSelectable);
  EXPECT_FALSE(pm.isDirty());
  EXPECT_EQ(plan.kvPrecision(), QStringLiteral("F16"));
  EXPECT_EQ(plan.backendsUsed(), QStringList{QStringLiteral("cpu")});
}

TEST(PlacementModel, UnavailableBackendsAreRefusedAndEditsAreTracked) {
  PlacementModel pm;
  pm.setBackends(cpuAndGpu(false));
  pm.setApplied(PlacementPlan::allOn(QStringLiteral("cpu"), threeLayers(), QStringLiteral("F16"),
                                     {QStringLiteral("F16"), QStringLiteral("Q8_0")}, {}));
  EXPECT_FALSE(pm.setCellBackend(2, kColFfnWeights, QStringLiteral("vulkan:0")));  // not built
  EXPECT_FALSE(pm.setCellBackend(2, kColFfnWeights, QStringLiteral("nonsense")));
  EXPECT_FALSE(pm.isDirty());

  // Data-driven: a backend that becomes available is offered, without code changes.
  pm.setBackends(cpuAndGpu(true));
  int changes = 0;
  QObject::connect(&pm, &PlacementModel::pendingChanged, [&] { ++changes; });
  ASSERT_TRUE(pm.setCellBackend(2, kColFfnWeights, QStringLiteral("vulkan:0")));
  EXPECT_GT(changes, 0);
  EXPECT_TRUE(pm.isDirty());
  EXPECT_EQ(pm.pending().strategy, QStringLiteral("custom"));
  EXPECT_TRUE(pm.data(pm.index(2, kColFfnWeights), PlacementModel::DirtyRole).toBool());
  EXPECT_FALSE(pm.data(pm.index(1, kColFfnWeights), PlacementModel::DirtyRole).toBool());
  EXPECT_EQ(pm.data(pm.index(2, kColFfnWeights), PlacementModel::BackendColorRole).value<QColor>(),
            theme::kVulkan);
  EXPECT_EQ(pm.data(pm.index(2, kColFfnWeights), Qt::DisplayRole).toString(),
            QStringLiteral("GPU Q4_K+"));
  EXPECT_EQ(pm.data(pm.index(2, kColFfnWeights), PlacementModel::PrecisionRole).toString(),
            QStringLiteral("Q4_K + Q6_K"));
  EXPECT_TRUE(pm.data(pm.index(2, kColFfnWeights), Qt::ToolTipRole)
                  .toString()
                  .contains(QStringLiteral("Pending")));
  EXPECT_TRUE(pm.pending().toJson().contains(QStringLiteral("vulkan:0")));
  pm.revertPending();
  EXPECT_FALSE(pm.isDirty());

  // A click cycles the unit among the available ones.
  ASSERT_TRUE(pm.cycleCellBackend(1, kColAttnKv));
  EXPECT_EQ(pm.pending().rows[1][kColAttnKv].backend, QStringLiteral("vulkan:0"));
  ASSERT_TRUE(pm.cycleCellBackend(1, kColAttnKv));
  EXPECT_EQ(pm.pending().rows[1][kColAttnKv].backend, QStringLiteral("cpu"));
  EXPECT_FALSE(pm.isDirty());
  EXPECT_FALSE(pm.cycleCellBackend(0, 1));  // the edge rows have one cell
  EXPECT_FALSE(pm.cycleCellBackend(1, kColTiming));

  // Linked cells (the KV cache) change precision together; unoffered precisions are refused.
  EXPECT_FALSE(pm.setCellPrecision(1, kColAttnWeights, QStringLiteral("F16")));
  ASSERT_TRUE(pm.setCellPrecision(2, kColAttnKv, QStringLiteral("Q8_0")));
  for (int r = 1; r <= 3; ++r)
    EXPECT_EQ(pm.pending().rows[r][kColAttnKv].precision, QStringLiteral("Q8_0"));
  EXPECT_EQ(pm.pending().kvPrecision(), QStringLiteral("Q8_0"));
  EXPECT_EQ(pm.applied().kvPrecision(), QStringLiteral("F16"));
}

// A placement applied over another: the cells that changed unit glow, and
// the glow fades; the others do not.
TEST(PlacementModel, MovedCellsAreMarkedAndFade) {
  PlacementModel pm;
  pm.setBackends(cpuAndGpu(true));
  const PlacementPlan cpu = PlacementPlan::allOn(
      QStringLiteral("cpu"), threeLayers(), QStringLiteral("F16"), {QStringLiteral("F16")}, {});
  pm.setApplied(cpu);
  EXPECT_FALSE(pm.moving());  // a first placement moves nothing
  PlacementPlan moved = cpu;
  moved.rows[2][kColFfnWeights].backend = QStringLiteral("vulkan:0");
  moved.rows[3][kColAttnKv].backend = QStringLiteral("vulkan:0");
  pm.setApplied(moved);
  EXPECT_TRUE(pm.moving());
  const double fresh = pm.data(pm.index(2, kColFfnWeights), PlacementModel::MovedRole).toDouble();
  EXPECT_GT(fresh, 0.5);
  EXPECT_GT(pm.data(pm.index(3, kColAttnKv), PlacementModel::MovedRole).toDouble(), 0.5);
  EXPECT_EQ(pm.data(pm.index(1, kColFfnWeights), PlacementModel::MovedRole).toDouble(), 0.0);
  EXPECT_EQ(pm.data(pm.index(2, kColAttnKv), PlacementModel::MovedRole).toDouble(), 0.0);
  QTest::qWait(200);
  EXPECT_LT(pm.data(pm.index(2, kColFfnWeights), PlacementModel::MovedRole).toDouble(), fresh);
  QTest::qWait(PlacementModel::kMoveFadeMs);
  EXPECT_FALSE(pm.moving());
  EXPECT_EQ(pm.data(pm.index(2, kColFfnWeights), PlacementModel::MovedRole).toDouble(), 0.0);
}

TEST(LiveStats, PlacementChangesAreMarkedOnTheTimeAxis) {
  LiveStats ls;
  ls.resetForModel(2);
  ls.generationStarted();
  ls.tokenGenerated(0);
  ls.placementChanged("auto: try layers:2");
  ls.tokenGenerated(1'000'000);
  ls.placementChanged("auto: keep layers:2");
  const LiveSnapshot s = ls.snapshot();
  ASSERT_EQ(s.placementMarks.size(), 2u);
  EXPECT_EQ(s.placementMarks[0].second, "auto: try layers:2");
  EXPECT_LE(s.placementMarks[0].first, s.placementMarks[1].first);
  ls.resetForModel(2);  // another model: its own timeline
  EXPECT_TRUE(ls.snapshot().placementMarks.empty());
}

TEST(DeviceInfo, CpuIsFoundAndGpuStrategiesSayWhyNot) {
  const auto devices = detectDevices(3);
  ASSERT_GE(devices.size(), 3);
  EXPECT_EQ(devices[0].kind, QStringLiteral("CPU"));
  EXPECT_TRUE(devices[0].present);
  EXPECT_TRUE(devices[0].details.join(QLatin1Char(' ')).contains(QStringLiteral("Threads: 3")));
  EXPECT_GT(devices[0].memTotal, 0);
  const auto backends = backendsFromDevices(devices);
  ASSERT_EQ(backends.size(), devices.size());
  EXPECT_TRUE(backends[0].available);
  bool anyGpu = false;
  for (const auto& b : backends.mid(1)) anyGpu |= b.available;
  for (const StrategyInfo& s : strategiesFor(backends)) {
    if (s.id == QLatin1String("cpu") || s.id == QLatin1String("custom")) {
      EXPECT_TRUE(s.available) << s.id.toStdString();
    } else if (!anyGpu) {
      EXPECT_FALSE(s.available) << s.id.toStdString();
      EXPECT_TRUE(s.reason.contains(QStringLiteral("GPU"))) << s.reason.toStdString();
    }
  }
  // With a GPU in use every strategy opens up; layers:N takes a count, attn-gpu and auto the
  // budget.
  auto withGpu = backends;
  withGpu[1].available = true;
  const auto strategies = strategiesFor(withGpu);
  ASSERT_EQ(strategies.size(), 7);
  for (const StrategyInfo& s : strategies) {
    EXPECT_TRUE(s.available) << s.id.toStdString();
    EXPECT_EQ(s.usesLayerCount, s.id == QLatin1String("layers")) << s.id.toStdString();
    EXPECT_EQ(s.usesBudget, s.id == QLatin1String("attn-gpu") || s.id == QLatin1String("auto") ||
                                s.id == QLatin1String("adaptive"))
        << s.id.toStdString();
  }
  EXPECT_TRUE(std::any_of(strategies.begin(), strategies.end(), [](const StrategyInfo& s) {
    return s.id == QLatin1String("adaptive") &&
           s.label.startsWith(QLatin1String("Auto (adaptive)"));
  }));
  // A device that is present but not in use is shown, not offered.
  QVector<DeviceInfo> two = devices.mid(0, 1);
  DeviceInfo a, b;
  a.kind = b.kind = QStringLiteral("Vulkan");
  a.backendId = QStringLiteral("vulkan:0");
  b.backendId = QStringLiteral("vulkan:1");
  a.name = QStringLiteral("first");
  b.name = QStringLiteral("second");
  a.present = b.present = true;
  a.inUse = true;
  a.memTotal = qint64{8} << 30;
  two << a << b;
  const auto bk = backendsFromDevices(two);
  ASSERT_EQ(bk.size(), 3);
  EXPECT_TRUE(bk[1].available);
  EXPECT_EQ(bk[1].label, QStringLiteral("GPU"));
  EXPECT_EQ(bk[1].memoryBytes, qint64{8} << 30);
  EXPECT_FALSE(bk[2].available);
  EXPECT_TRUE(bk[2].reason.contains(QStringLiteral("one GPU at a time")))
      << bk[2].reason.toStdString();
}

// ---- live stats -------------------------------------------------------------------

TEST(LiveStats, SnapshotsCountTokensLayersAndMemory) {
  LiveStats ls;
  const uint64_t v0 = ls.version();
  auto layers = ls.resetForModel(4);
  EXPECT_GT(ls.version(), v0);
  ls.generationStarted();
  ls.tokenGenerated(0);
  for (int i = 0; i < 50; ++i) ls.tokenGenerated(2'000'000);  // 2 ms apart
  layers->record_layer(2, 100'000);
  ls.generationFinished(12.5, 400.0);
  ls.setMemory({}, TierBytes{1000, 200}, {}, false, false);
  const LiveSnapshot s = ls.snapshot();
  EXPECT_EQ(s.itl.count, 50u);
  EXPECT_NEAR(s.itl.percentile_ms(0.5), 2.0, 0.2);
  ASSERT_EQ(s.layers.size(), 4u);
  EXPECT_EQ(s.layers[2].count, 1u);
  EXPECT_EQ(s.tokensTotal, 51u);
  EXPECT_GE(s.tokensPerSecond.size(), 1u);  // a short reply still leaves a point
  EXPECT_EQ(s.ram.weights, 1000u);
  EXPECT_EQ(s.ram.kv, 200u);
  EXPECT_DOUBLE_EQ(s.lastTtftMs, 12.5);
  EXPECT_FALSE(s.generating);
  ls.resetTimings();
  EXPECT_EQ(ls.snapshot().itl.count, 0u);
  EXPECT_EQ(ls.snapshot().layers[2].count, 0u);
}

// ---- Markdown -----------------------------------------------------------------------

TEST(Markdown, SplitsFencedCode) {
  const auto segs = splitMarkdownFences(QStringLiteral(
      "Intro **bold**\n\n```cpp\nint x = 1;\n\nreturn x;\n```\nAfter\n~~~\nraw\n~~~"));
  ASSERT_EQ(segs.size(), 4);
  EXPECT_FALSE(segs[0].code);
  EXPECT_TRUE(segs[1].code);
  EXPECT_EQ(segs[1].language, QStringLiteral("cpp"));
  EXPECT_EQ(segs[1].text, QStringLiteral("int x = 1;\n\nreturn x;"));
  EXPECT_TRUE(segs[1].closed);
  EXPECT_EQ(segs[2].text.trimmed(), QStringLiteral("After"));
  EXPECT_TRUE(segs[3].code);
  EXPECT_EQ(segs[3].text, QStringLiteral("raw"));
  // A reply still streaming: the open fence is code up to the end.
  const auto open = splitMarkdownFences(QStringLiteral("Here:\n```py\nprint(1)\npri"));
  ASSERT_EQ(open.size(), 2);
  EXPECT_TRUE(open[1].code);
  EXPECT_FALSE(open[1].closed);
  EXPECT_EQ(open[1].text, QStringLiteral("print(1)\npri"));
  // A fence with a shorter or different marker does not close.
  EXPECT_EQ(splitMarkdownFences(QStringLiteral("````\na\n```\nb\n````")).size(), 1);
}

TEST(Markdown, RendersCodeInAFramedMonospaceBlock) {
  QTextDocument doc;
  renderMarkdown(&doc,
                 QStringLiteral("# Title\n\nSome *text*.\n\n```sh\nls -la\n```\n\n- one\n- two"));
  EXPECT_TRUE(doc.toPlainText().contains(QStringLiteral("Title")));
  EXPECT_TRUE(doc.toPlainText().contains(QStringLiteral("ls -la")));
  EXPECT_FALSE(doc.toPlainText().contains(QStringLiteral("```")));
  EXPECT_FALSE(doc.toPlainText().contains(QStringLiteral("# Title")));  // a heading, not text
  int frames = 0;
  bool monoCode = false;
  for (QTextFrame* f : doc.rootFrame()->childFrames()) {
    ++frames;
    for (auto it = f->begin(); !it.atEnd(); ++it) {
      const QTextBlock b = it.currentBlock();
      if (b.text() == QLatin1String("ls -la"))
        monoCode = QFontInfo(b.charFormat().font()).fixedPitch();
    }
  }
  EXPECT_EQ(frames, 1);
  EXPECT_TRUE(monoCode);
  EXPECT_EQ(displayableText(QStringLiteral("a\x01"
                                           "b\nc\uFFFD\uFFFD\uFFFDd")),
            QStringLiteral("ab\nc\uFFFDd"));
}

// ---- command line -----------------------------------------------------------------------

TEST(AppOptions, ParsesTheCommandLine) {
  AppOptions o;
  QString err;
  bool exitNow = false;
  ASSERT_TRUE(parseAppOptions(
      {QStringLiteral("loom-chat"), QStringLiteral("--screenshot"), QStringLiteral("/tmp/x.png"),
       QStringLiteral("--demo"), QStringLiteral("--tab"), QStringLiteral("Placement"),
       QStringLiteral("--data-dir"), QStringLiteral("/d"), QStringLiteral("--threads"),
       QStringLiteral("4")},
      &o, &err, &exitNow))
      << err.toStdString();
  EXPECT_FALSE(exitNow);
  EXPECT_TRUE(o.demo);
  EXPECT_EQ(o.screenshotPath, QStringLiteral("/tmp/x.png"));
  EXPECT_EQ(o.screenshotTab, QStringLiteral("placement"));
  EXPECT_EQ(o.dbPath(), QStringLiteral("/d/loom.db"));
  EXPECT_EQ(o.threads, 4);
  EXPECT_TRUE(o.demoModelPath().endsWith(QStringLiteral("loom/demo-stories-like.gguf")));

  AppOptions bad;
  EXPECT_FALSE(parseAppOptions(
      {QStringLiteral("loom-chat"), QStringLiteral("--tab"), QStringLiteral("nope")}, &bad, &err,
      &exitNow));
  EXPECT_FALSE(parseAppOptions(
      {QStringLiteral("loom-chat"), QStringLiteral("a.gguf"), QStringLiteral("--demo")}, &bad, &err,
      &exitNow));
  EXPECT_FALSE(parseAppOptions(
      {QStringLiteral("loom-chat"), QStringLiteral("--threads"), QStringLiteral("-2")}, &bad, &err,
      &exitNow));
  AppOptions help;
  EXPECT_TRUE(parseAppOptions({QStringLiteral("loom-chat"), QStringLiteral("--help")}, &help, &err,
                              &exitNow));
  EXPECT_TRUE(exitNow);
  EXPECT_TRUE(err.contains(QStringLiteral("--screenshot")));
}

}  // namespace
