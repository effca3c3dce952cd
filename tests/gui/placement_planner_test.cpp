// The placement view models over the real engine, without the GUI: the
// planner (strategy selector -> grid plan -> the engine's Placement, cell
// edits -> Placement, the cost model's estimate, presets as the engine's
// JSON), placement presets in the store (round trip, the schema migration
// that added their model columns) and the preset list. None of this needs a
// GPU: the planner plans for one whether or not a device exists.
#include "app/placement_planner.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <QSignalSpy>

#include "app/engine_bridge.h"
#include "app/placement_model.h"
#include "app/preset_list_model.h"
#include "app/theme.h"
#include "engine/model/model.h"
#include "engine/placement/adaptive.h"
#include "engine/placement/cost_model.h"
#include "engine/placement/placement.h"
#include "engine/placement/strategy.h"
#include "storage/store.h"
#include "tests/gui/gui_test_util.h"

namespace {

const QString kGpu = QStringLiteral("vulkan:0");

std::shared_ptr<const loom::Model> tinyModel() {
  static std::shared_ptr<const loom::Model> m = [] {
    auto r = loom::load_model(guitest::tinyModel().toStdString());
    return r.ok() ? std::shared_ptr<const loom::Model>(std::move(r).value()) : nullptr;
  }();
  return m;
}

std::shared_ptr<PlacementPlanner> plannerFor(
    bool gpu, const loom::CostModel& cost = loom::CostModel::defaults()) {
  auto model = tinyModel();
  if (!model) return nullptr;
  ModelSummary s = summarizeModel(*model, guitest::tinyModel(), false);
  s.nCtx = 512;
  return std::make_shared<PlacementPlanner>(model, s, cost, gpu ? kGpu : QString(),
                                            gpu ? qint64{1} << 30 : 0);
}

// A machine whose GPU is far faster than its CPU, even for a tiny model's short ops.
loom::CostModel fastGpu() {
  loom::CostModel c = loom::CostModel::defaults();
  c.unit[static_cast<size_t>(loom::Unit::kCpu)] = {1e9, 100e-6};
  c.unit[static_cast<size_t>(loom::Unit::kGpu)] = {1000e9, 1e-6};
  c.xfer_latency_s = 1e-6;
  c.measured = true;
  return c;
}

QVector<BackendInfo> backends(bool gpu) {
  return {BackendInfo{QStringLiteral("cpu"), QStringLiteral("CPU"), theme::kCpu, true, {}, {}, 0},
          BackendInfo{kGpu, QStringLiteral("GPU"), theme::kVulkan, gpu,
                      gpu ? QString() : QStringLiteral("Vulkan: none found"),
                      QStringLiteral("test device"), gpu ? qint64{1} << 30 : 0}};
}

PlacementPlan cpuPlan(const PlacementPlanner& planner) {
  return planner.toPlan(loom::Placement::uniform(planner.layerCount(), loom::Unit::kCpu),
                        QStringLiteral("F16"), 512);
}

// Every cell's unit, row by row: "C" or "G", "|" between rows.
std::string units(const PlacementPlan& p) {
  std::string s;
  for (int r = 0; r < p.rows.size(); ++r) {
    if (r) s += '|';
    for (int c = 0; c < (p.isEdgeRow(r) ? 1 : kColCount); ++c)
      s += p.rows[r][c].backend == QLatin1String("cpu") ? 'C' : 'G';
  }
  return s;
}

TEST(PlacementPlanner, GridOfAnEnginePlacement) {
  auto planner = plannerFor(true);
  ASSERT_TRUE(planner);
  const PlacementPlan plan = cpuPlan(*planner);
  ASSERT_EQ(plan.rows.size(), 5);
  EXPECT_EQ(units(plan), "C|CCCC|CCCC|CCCC|C");
  EXPECT_EQ(plan.nCtx, 512);
  const PlacementCell& ffn = plan.rows[2][kColFfnWeights];
  EXPECT_EQ(ffn.precision, QStringLiteral("Q8_0"));
  EXPECT_EQ(ffn.fileDtype, QStringLiteral("Q8_0"));
  EXPECT_TRUE(ffn.dtype.isEmpty());
  // Re-quantization targets whose blocks divide the rows (128 values: not the 256-value K-quants).
  EXPECT_TRUE(ffn.precisions.contains(kKeepPrecision));
  EXPECT_TRUE(ffn.precisions.contains(QStringLiteral("Q4_0")));
  EXPECT_TRUE(ffn.precisions.contains(QStringLiteral("F16")));
  EXPECT_FALSE(ffn.precisions.contains(QStringLiteral("Q4_K")));
  EXPECT_TRUE(plan.rows[1][kColNormRope].precisions.isEmpty());  // norm vectors stay F32
  EXPECT_EQ(plan.rows[1][kColAttnKv].precisions,
            (QStringList{QStringLiteral("F16"), QStringLiteral("Q8_0")}));
  // And back: the same engine placement.
  EXPECT_TRUE(planner->toPlacement(plan).same_as(loom::Placement::uniform(3, loom::Unit::kCpu)));
  QString error;
  EXPECT_TRUE(planner->check(plan, &error)) << error.toStdString();
}

TEST(PlacementPlanner, CellEditsBecomeTheEnginePlacement) {
  auto planner = plannerFor(true);
  ASSERT_TRUE(planner);
  PlacementModel pm;
  pm.setBackends(backends(true));
  pm.setApplied(cpuPlan(*planner));
  // Layer 1's FFN to the GPU (a click), layer 0's attention weights to Q4_0, the KV cache to Q8_0.
  ASSERT_TRUE(pm.cycleCellBackend(2, kColFfnWeights));
  ASSERT_TRUE(pm.setCellPrecision(1, kColAttnWeights, QStringLiteral("Q4_0")));
  ASSERT_TRUE(pm.setCellPrecision(3, kColAttnKv, QStringLiteral("Q8_0")));
  ASSERT_TRUE(pm.setCellBackend(4, 0, kGpu));  // the output matrix
  EXPECT_EQ(pm.data(pm.index(1, kColAttnWeights), Qt::DisplayRole).toString(),
            QStringLiteral("CPU Q4_0"));
  EXPECT_EQ(pm.data(pm.index(2, kColFfnWeights), Qt::DisplayRole).toString(),
            QStringLiteral("GPU Q8_0"));
  EXPECT_EQ(pm.pending().strategy, QStringLiteral("custom"));
  const loom::Placement p = planner->toPlacement(pm.pending());
  ASSERT_EQ(p.layers.size(), 3u);
  for (int l = 0; l < 3; ++l) {
    for (int g = 0; g < loom::kNumOpGroups; ++g) {
      const bool gpu = l == 1 && g == static_cast<int>(loom::OpGroup::kFfn);
      EXPECT_EQ(p.layers[static_cast<size_t>(l)].g[static_cast<size_t>(g)].unit,
                gpu ? loom::Unit::kGpu : loom::Unit::kCpu)
          << "layer " << l << " group " << g;
    }
  }
  EXPECT_EQ(p.layers[0][loom::OpGroup::kAttnW].dtype, loom::DType::kQ4_0);
  EXPECT_FALSE(p.layers[1][loom::OpGroup::kAttnW].dtype.has_value());
  EXPECT_EQ(p.output.unit, loom::Unit::kGpu);
  EXPECT_EQ(p.embed.unit, loom::Unit::kCpu);
  EXPECT_EQ(pm.pending().kvPrecision(), QStringLiteral("Q8_0"));  // the whole column followed
  QString error;
  EXPECT_TRUE(planner->check(pm.pending(), &error)) << error.toStdString();
  // "keep" (or the file's own type) goes back to the file's precision.
  ASSERT_TRUE(pm.setCellPrecision(1, kColAttnWeights, kKeepPrecision));
  EXPECT_FALSE(
      planner->toPlacement(pm.pending()).layers[0][loom::OpGroup::kAttnW].dtype.has_value());
  EXPECT_EQ(pm.pending().rows[1][kColAttnWeights].precision, QStringLiteral("Q8_0"));
  EXPECT_FALSE(pm.setCellPrecision(1, kColAttnWeights, QStringLiteral("Q4_K")));  // not offered

  // The estimate follows: bytes on the GPU, a predicted time per row.
  const PlanEstimate e = planner->estimate(pm.pending());
  ASSERT_TRUE(e.valid);
  EXPECT_EQ(e.rowMs.size(), 5);
  EXPECT_GT(e.stepMs, 0.0);
  EXPECT_GT(e.gpuWeights, 0);
  EXPECT_EQ(e.gpuKv, 0);  // attention stayed on the CPU
  EXPECT_GT(e.cpuKv, 0);
  EXPECT_GT(e.transfers, 0);  // the FFN's input and output cross units
  EXPECT_GT(e.gpuOverhead, 0);
  const PlanEstimate cpu = planner->estimate(cpuPlan(*planner));
  EXPECT_EQ(cpu.gpuWeights, 0);
  EXPECT_EQ(cpu.transfers, 0);
  EXPECT_EQ(cpu.gpuOverhead, 0);
  pm.setEstimate(e);
  EXPECT_NEAR(pm.data(pm.index(2, kColTiming), PlacementModel::PredictedMsRole).toDouble(),
              e.rowMs[2], 1e-9);
  EXPECT_FALSE(pm.data(pm.index(2, kColTiming), PlacementModel::P50MsRole)
                   .isValid());  // nothing measured yet
  MeasuredTimes m;
  m.p50Ms = {0, 0.5, 0.6, 0.7, 0};
  m.p99Ms = {0, 0.9, 1.0, 1.1, 0};
  m.counts = {0, 10, 10, 10, 0};
  pm.setMeasured(m);
  EXPECT_DOUBLE_EQ(pm.data(pm.index(2, kColTiming), PlacementModel::P50MsRole).toDouble(), 0.6);
  EXPECT_DOUBLE_EQ(pm.data(pm.index(3, kColTiming), PlacementModel::P99MsRole).toDouble(), 1.1);
}

TEST(PlacementPlanner, StrategySelectorMakesTheEnginesPlacements) {
  auto planner = plannerFor(true);
  ASSERT_TRUE(planner);
  const PlacementPlan cur = cpuPlan(*planner);
  PlacementPlan out;
  QString error;
  ASSERT_TRUE(planner->plan(QStringLiteral("layers"), 2, 1024, cur, &out, &error))
      << error.toStdString();
  EXPECT_EQ(units(out), "C|GGGG|GGGG|CCCC|C");
  EXPECT_EQ(out.strategy, QStringLiteral("layers"));
  EXPECT_EQ(out.gpuLayers, 2);
  // The same placement the engine's strategy makes (what `loom --strategy layers:2` runs).
  loom::StrategyOptions so;
  so.strategy = "layers:2";
  so.n_ctx = 512;
  auto engine = loom::make_placement(*tinyModel(), so, loom::CostModel::defaults());
  ASSERT_TRUE(engine.ok()) << engine.message();
  EXPECT_TRUE(planner->toPlacement(out).same_as(*engine));
  EXPECT_EQ(planner->toPlacement(out).strategy, "layers:2");

  ASSERT_TRUE(planner->plan(QStringLiteral("layers"), 3, 1024, cur, &out, &error));
  EXPECT_EQ(units(out), "C|GGGG|GGGG|GGGG|G");  // all layers: the output goes too
  ASSERT_TRUE(planner->plan(QStringLiteral("gpu"), 0, 1024, cur, &out, &error));
  EXPECT_EQ(units(out), "G|GGGG|GGGG|GGGG|G");
  ASSERT_TRUE(planner->plan(QStringLiteral("cpu"), 0, 1024, out, &out, &error));
  EXPECT_EQ(units(out), "C|CCCC|CCCC|CCCC|C");
  // Attention on the GPU; with no room for more the FFNs stay on the CPU.
  ASSERT_TRUE(planner->plan(QStringLiteral("attn-gpu"), 0, 0, cur, &out, &error));
  EXPECT_EQ(units(out), "C|GGCG|GGCG|GGCG|C");
  ASSERT_TRUE(planner->plan(QStringLiteral("attn-gpu"), 0, 1024, cur, &out, &error));
  EXPECT_EQ(units(out), "C|GGGG|GGGG|GGGG|G");
  // Auto within a zero budget: nothing fits on the GPU.
  ASSERT_TRUE(planner->plan(QStringLiteral("auto"), 0, 0, cur, &out, &error));
  EXPECT_EQ(units(out), "C|CCCC|CCCC|CCCC|C");
  EXPECT_EQ(out.strategy, QStringLiteral("auto"));
  // Auto with room: on a tiny model the default costs keep everything on the CPU (a GPU op's fixed
  // cost outweighs its speed); where the GPU is much faster, the layers go there.
  ASSERT_TRUE(planner->plan(QStringLiteral("auto"), 0, 1024, cur, &out, &error));
  EXPECT_EQ(units(out), "C|CCCC|CCCC|CCCC|C");
  ASSERT_TRUE(
      plannerFor(true, fastGpu())->plan(QStringLiteral("auto"), 0, 1024, cur, &out, &error));
  EXPECT_EQ(units(out),
            "C|GGGG|GGGG|GGGG|G");  // the embedding stays on the CPU (the engine's auto)
  // Custom keeps the cells as they are; the KV precision is kept by every strategy.
  PlacementPlan q8 = cur;
  for (int r = 1; r <= 3; ++r)
    q8.rows[r][kColAttnKv].precision = q8.rows[r][kColAttnKv].dtype = QStringLiteral("Q8_0");
  ASSERT_TRUE(planner->plan(QStringLiteral("custom"), 0, 0, q8, &out, &error));
  EXPECT_TRUE(out.sameCells(q8));
  ASSERT_TRUE(planner->plan(QStringLiteral("gpu"), 0, 0, q8, &out, &error));
  EXPECT_EQ(out.kvPrecision(), QStringLiteral("Q8_0"));

  // Without a GPU the GPU strategies fail with the engine's reason, and GPU cells are refused.
  auto cpuOnly = plannerFor(false);
  EXPECT_FALSE(cpuOnly->plan(QStringLiteral("gpu"), 0, 0, cur, &out, &error));
  EXPECT_TRUE(error.contains(QStringLiteral("GPU"))) << error.toStdString();
  ASSERT_TRUE(cpuOnly->plan(QStringLiteral("cpu"), 0, 0, cur, &out, &error));
  PlacementPlan withGpu = cur;
  withGpu.rows[1][kColFfnWeights].backend = kGpu;
  EXPECT_FALSE(cpuOnly->check(withGpu, &error));
  EXPECT_TRUE(error.contains(QStringLiteral("no GPU"))) << error.toStdString();
  EXPECT_TRUE(planner->check(withGpu, &error));
}

// Auto (adaptive) starts from auto's placement, with a controller that
// moves it while generating; other strategies and a machine without a GPU get none.
TEST(PlacementPlanner, AdaptiveStartsWhereAutoDoes) {
  auto planner = plannerFor(true, fastGpu());
  ASSERT_TRUE(planner);
  const PlacementPlan cur = cpuPlan(*planner);
  PlacementPlan autoPlan, adaptive;
  QString error;
  ASSERT_TRUE(planner->plan(QStringLiteral("auto"), 0, 1024, cur, &autoPlan, &error));
  ASSERT_TRUE(planner->plan(QStringLiteral("adaptive"), 0, 1024, cur, &adaptive, &error))
      << error.toStdString();
  EXPECT_TRUE(adaptive.sameCells(autoPlan));
  EXPECT_EQ(adaptive.strategy, QStringLiteral("adaptive"));
  auto c = planner->makeAdaptive(adaptive);
  ASSERT_TRUE(c);
  c->start(planner->toPlacement(adaptive));
  EXPECT_TRUE(c->current().same_as(planner->toPlacement(adaptive)));
  EXPECT_TRUE(c->exploring());
  EXPECT_FALSE(planner->makeAdaptive(autoPlan));
  EXPECT_FALSE(plannerFor(false)->makeAdaptive(adaptive));
}

TEST(PlacementPlanner, PresetsAreTheEnginesJson) {
  auto planner = plannerFor(true);
  ASSERT_TRUE(planner);
  PlacementPlan plan;
  QString error;
  ASSERT_TRUE(planner->plan(QStringLiteral("layers"), 1, 1024, cpuPlan(*planner), &plan, &error));
  plan.rows[3][kColFfnWeights].dtype = plan.rows[3][kColFfnWeights].precision =
      QStringLiteral("Q4_0");
  for (int r = 1; r <= 3; ++r)
    plan.rows[r][kColAttnKv].precision = plan.rows[r][kColAttnKv].dtype = QStringLiteral("Q8_0");
  const QString json = planner->toPresetJson(plan);
  // The engine reads it as a placement of its own.
  auto engine = loom::Placement::from_json(json.toStdString(), 3);
  ASSERT_TRUE(engine.ok()) << engine.message();
  EXPECT_EQ((*engine).layers[0][loom::OpGroup::kFfn].unit, loom::Unit::kGpu);
  EXPECT_EQ((*engine).layers[2][loom::OpGroup::kFfn].dtype, loom::DType::kQ4_0);

  PlacementPlan back;
  ASSERT_TRUE(planner->fromPresetJson(json, cpuPlan(*planner), &back, &error))
      << error.toStdString();
  EXPECT_TRUE(back.sameCells(plan));
  EXPECT_EQ(back.kvPrecision(), QStringLiteral("Q8_0"));  // carried in the attention groups
  EXPECT_EQ(back.strategy, QStringLiteral("layers"));
  EXPECT_EQ(back.gpuLayers, 1);

  // Another model's preset, a GPU preset without a GPU, and nonsense are refused with a reason.
  loom::Placement five = loom::Placement::uniform(5, loom::Unit::kCpu);
  EXPECT_FALSE(
      planner->fromPresetJson(QString::fromStdString(five.to_json()), plan, &back, &error));
  EXPECT_TRUE(error.contains(QStringLiteral("5 layers"))) << error.toStdString();
  EXPECT_FALSE(plannerFor(false)->fromPresetJson(json, plan, &back, &error));
  EXPECT_TRUE(error.contains(QStringLiteral("GPU"))) << error.toStdString();
  EXPECT_FALSE(planner->fromPresetJson(QStringLiteral("{nope"), plan, &back, &error));
}

// ---- presets in the store ---------------------------------------------------------

std::unique_ptr<loom::storage::Store> openStore(const QString& dir) {
  auto s = loom::storage::Store::open((dir + QStringLiteral("/loom.db")).toStdString());
  return s.ok() ? std::move(s).value() : nullptr;
}

TEST(PlacementPresets, RoundTripInTheStore) {
  const QString dir = guitest::freshDir(QStringLiteral("presets"));
  auto planner = plannerFor(true);
  ASSERT_TRUE(planner);
  PlacementPlan plan;
  QString error;
  ASSERT_TRUE(planner->plan(QStringLiteral("attn-gpu"), 0, 0, cpuPlan(*planner), &plan, &error));
  {
    auto store = openStore(dir);
    ASSERT_TRUE(store);
    PresetListModel presets(store.get());
    presets.setLayerCount(3);
    EXPECT_EQ(presets.rowCount(), 0);
    EXPECT_EQ(presets.save(QStringLiteral("   "), QStringLiteral("{}"), 3, {}, &error),
              0);  // needs a name
    const qint64 id = presets.save(QStringLiteral("attention on GPU"), planner->toPresetJson(plan),
                                   3, QStringLiteral("gui test model"), &error);
    ASSERT_NE(id, 0) << error.toStdString();
    // Saving again under the same name replaces it.
    EXPECT_EQ(presets.save(QStringLiteral("attention on GPU"), planner->toPresetJson(plan), 3,
                           QStringLiteral("gui test model"), &error),
              id);
    ASSERT_NE(presets.save(QStringLiteral("big model"), QStringLiteral("{}"), 40,
                           QStringLiteral("other"), &error),
              0);
    ASSERT_EQ(presets.rowCount(), 2);
  }
  // Another run of the app finds them.
  auto store = openStore(dir);
  ASSERT_TRUE(store);
  PresetListModel presets(store.get());
  presets.setLayerCount(3);
  ASSERT_EQ(presets.rowCount(), 2);
  const QModelIndex first = presets.index(0);  // ordered by name
  EXPECT_EQ(first.data(Qt::DisplayRole).toString(), QStringLiteral("attention on GPU"));
  EXPECT_TRUE(first.data(PresetListModel::CompatibleRole).toBool());
  EXPECT_TRUE(presets.flags(first) & Qt::ItemIsEnabled);
  EXPECT_TRUE(first.data(Qt::ToolTipRole).toString().contains(QStringLiteral("gui test model")));
  const QModelIndex other = presets.index(1);
  EXPECT_FALSE(other.data(PresetListModel::CompatibleRole).toBool());  // saved for 40 layers
  EXPECT_EQ(presets.flags(other), Qt::NoItemFlags);
  EXPECT_TRUE(other.data(Qt::DisplayRole).toString().contains(QStringLiteral("40 layers")));

  const qint64 id = first.data(PresetListModel::PresetIdRole).toLongLong();
  const loom::storage::PlacementPreset* p = presets.preset(id);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->n_layer, 3);
  EXPECT_EQ(p->model, "gui test model");
  PlacementPlan back;
  ASSERT_TRUE(
      planner->fromPresetJson(QString::fromStdString(p->spec), cpuPlan(*planner), &back, &error));
  EXPECT_TRUE(back.sameCells(plan));
  EXPECT_EQ(units(back), "C|GGCG|GGCG|GGCG|C");

  ASSERT_TRUE(presets.remove(id, &error)) << error.toStdString();
  EXPECT_EQ(presets.rowCount(), 1);
  EXPECT_FALSE(presets.remove(id, &error));
  EXPECT_TRUE(error.contains(QStringLiteral("no placement preset"))) << error.toStdString();
}

// Version 2 of the schema as it was released (frozen here: never update this copy).
constexpr const char* kSchemaV2 = R"sql(
CREATE TABLE chats(id INTEGER PRIMARY KEY, title TEXT NOT NULL, created_at INTEGER NOT NULL,
                   updated_at INTEGER NOT NULL, system_prompt TEXT NOT NULL DEFAULT '',
                   temperature REAL NOT NULL DEFAULT 0.8, top_k INTEGER NOT NULL DEFAULT 40,
                   top_p REAL NOT NULL DEFAULT 0.95, min_p REAL NOT NULL DEFAULT 0.05,
                   repeat_penalty REAL NOT NULL DEFAULT 1.1, seed INTEGER NOT NULL DEFAULT -1,
                   max_tokens INTEGER NOT NULL DEFAULT 512, n_ctx INTEGER NOT NULL DEFAULT 0);
CREATE TABLE messages(id INTEGER PRIMARY KEY, chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
                      role TEXT NOT NULL, content TEXT NOT NULL, created_at INTEGER NOT NULL,
                      state INTEGER NOT NULL DEFAULT 0, meta TEXT NOT NULL DEFAULT '');
CREATE INDEX messages_by_chat ON messages(chat_id, id);
CREATE TABLE settings(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE recent_models(path TEXT PRIMARY KEY, name TEXT NOT NULL, description TEXT NOT NULL,
                           size_bytes INTEGER NOT NULL, last_used INTEGER NOT NULL);
CREATE TABLE placement_presets(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, spec TEXT NOT NULL,
                               created_at INTEGER NOT NULL);
PRAGMA user_version = 2;
INSERT INTO chats(id, title, created_at, updated_at) VALUES(3, 'kept chat', 1000, 2000);
INSERT INTO messages(id, chat_id, role, content, created_at) VALUES(1, 3, 'user', 'hello from v2', 1500);
INSERT INTO placement_presets VALUES(5, 'old preset', '{"strategy":"cpu"}', 1234);
)sql";

TEST(PlacementPresets, MigrationAddsTheModelColumns) {
  const QString dir = guitest::freshDir(QStringLiteral("presets-v2"));
  const std::string path = (dir + QStringLiteral("/loom.db")).toStdString();
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    char* err = nullptr;
    const int rc = sqlite3_exec(db, kSchemaV2, nullptr, nullptr, &err);
    const std::string message = err ? err : "";
    sqlite3_free(err);
    sqlite3_close(db);
    ASSERT_EQ(rc, SQLITE_OK) << message;
  }
  auto store = openStore(dir);
  ASSERT_TRUE(store);
  EXPECT_EQ(*store->schema_version(), loom::storage::kSchemaVersion);
  EXPECT_GE(loom::storage::kSchemaVersion, 3);
  // What version 2 held is there, the old preset reads as "any model".
  EXPECT_EQ(store->get_chat(3)->title, "kept chat");
  EXPECT_EQ(store->list_messages(3)->front().content, "hello from v2");
  auto presets = store->list_presets();
  ASSERT_TRUE(presets.ok()) << presets.message();
  ASSERT_EQ(presets->size(), 1u);
  EXPECT_EQ(presets->front().name, "old preset");
  EXPECT_EQ(presets->front().spec, R"({"strategy":"cpu"})");
  EXPECT_EQ(presets->front().created_ms, 1234);
  EXPECT_EQ(presets->front().n_layer, 0);
  EXPECT_EQ(presets->front().model, "");
  PresetListModel list(store.get());
  list.setLayerCount(3);
  EXPECT_TRUE(list.index(0).data(PresetListModel::CompatibleRole).toBool());
  // The new columns work, and replacing by name updates them.
  ASSERT_TRUE(store->save_preset("old preset", "{}", 22, "tinyllama").ok());
  presets = store->list_presets();
  EXPECT_EQ(presets->front().id, 5);
  EXPECT_EQ(presets->front().n_layer, 22);
  EXPECT_EQ(presets->front().model, "tinyllama");
  // Opening again migrates nothing more.
  store.reset();
  store = openStore(dir);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->list_presets()->front().n_layer, 22);
}

}  // namespace
