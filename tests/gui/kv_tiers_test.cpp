// The KV tier settings ("KV memory…"): the dialog's values round-trip through
// window.ini, a folder that cannot be made is refused in the dialog, and the
// engine worker makes the session again with new settings, or keeps the old
// session (and says why) when the engine refuses them.
#include <gtest/gtest.h>

#include <QApplication>
#include <QComboBox>
#include <QDialog>
#include <QDir>
#include <QDoubleSpinBox>
#include <QFile>
#include <QFileInfo>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSettings>
#include <QSignalSpy>
#include <QTableView>
#include <QTest>
#include <QTimer>

#include "app/chat_controller.h"
#include "app/composer.h"
#include "app/engine_panel.h"
#include "app/engine_worker.h"
#include "app/kv_tiers_dialog.h"
#include "app/live_stats.h"
#include "app/main_window.h"
#include "app/placement_model.h"
#include "app/placement_panel.h"
#include "tests/gui/gui_test_util.h"

namespace {

TEST(KvTiers, DialogValuesRoundTripThroughTheIniFile) {
  const QString dir = guitest::freshDir(QStringLiteral("kv-tiers-ini"));
  const QString ini = dir + QStringLiteral("/window.ini");
  // Nothing saved: automatic RAM, the default folder, importance, as in RAM.
  const KvTierSettings none = KvTiersDialog::load(ini);
  EXPECT_EQ(none, KvTierSettings{});

  KvTierSettings s;
  s.gpuBudgetMiB = 3072;
  s.ramBudgetMiB = 1536;
  s.spillDir = dir + QStringLiteral("/spill");
  s.policy = QStringLiteral("lru");
  s.spillType = QStringLiteral("q8_0");
  KvTiersDialog dialog(KvTierSettings{}, QStringLiteral("/default/kv"));
  dialog.setSettings(s);
  EXPECT_EQ(dialog.settings(), s);
  KvTiersDialog::save(ini, dialog.settings());
  EXPECT_EQ(KvTiersDialog::load(ini), s);
  EXPECT_TRUE(
      KvTiersDialog::summary(s, QStringLiteral("/default/kv")).contains(QStringLiteral("1.5")));
  // The GPU budget (the device tier): "Up to" with its size, else all on the GPU.
  EXPECT_TRUE(
      KvTiersDialog::summary(s, QStringLiteral("/default/kv")).contains(QStringLiteral("3.0")));
  EXPECT_TRUE(dialog.findChild<QDoubleSpinBox*>(QStringLiteral("KvGpuGiB"))->isEnabled());
  dialog.findChild<QComboBox*>(QStringLiteral("KvGpuMode"))->setCurrentIndex(0);
  EXPECT_EQ(dialog.settings().gpuBudgetMiB, 0);
  EXPECT_FALSE(dialog.findChild<QDoubleSpinBox*>(QStringLiteral("KvGpuGiB"))->isEnabled());

  // Values a hand-edited file may hold fall back to the defaults.
  {
    QSettings f(ini, QSettings::IniFormat);
    f.setValue(QStringLiteral("kv/policy"), QStringLiteral("fifo"));
    f.setValue(QStringLiteral("kv/spillType"), QStringLiteral("fp4"));
  }
  const KvTierSettings odd = KvTiersDialog::load(ini);
  EXPECT_EQ(odd.policy, QStringLiteral("importance"));
  EXPECT_TRUE(odd.spillType.isEmpty());

  // No limit: nothing spills, so the folder and policy are not asked for.
  KvTierSettings nolimit;
  nolimit.ramBudgetMiB = 0;
  dialog.setSettings(nolimit);
  EXPECT_EQ(dialog.settings().ramBudgetMiB, 0);
  EXPECT_FALSE(dialog.findChild<QLineEdit*>(QStringLiteral("KvSpillDir"))->isEnabled());
}

TEST(KvTiers, AFolderThatCannotBeMadeIsRefusedInTheDialog) {
  const QString dir = guitest::freshDir(QStringLiteral("kv-tiers-bad"));
  // A folder under a plain file cannot be made, not even by root.
  QFile file(dir + QStringLiteral("/file"));
  ASSERT_TRUE(file.open(QIODevice::WriteOnly));
  file.close();
  KvTierSettings s;
  s.spillDir = dir + QStringLiteral("/file/spill");
  KvTiersDialog dialog(s, QStringLiteral("/default/kv"));
  dialog.show();
  dialog.accept();
  EXPECT_NE(dialog.result(), QDialog::Accepted);
  auto* error = dialog.findChild<QLabel*>(QStringLiteral("Error"));
  ASSERT_NE(error, nullptr);
  EXPECT_TRUE(error->isVisible());
  EXPECT_TRUE(error->text().contains(QStringLiteral("cannot be written")))
      << error->text().toStdString();

  // A good folder is accepted (and made).
  dialog.findChild<QLineEdit*>(QStringLiteral("KvSpillDir"))->setText(dir + QStringLiteral("/kv"));
  dialog.accept();
  EXPECT_EQ(dialog.result(), QDialog::Accepted);
  EXPECT_TRUE(QFileInfo(dir + QStringLiteral("/kv")).isDir());
}

TEST(KvTiers, TheWorkerMakesTheSessionAgainOrKeepsTheOldOne) {
  const QString dir = guitest::freshDir(QStringLiteral("kv-tiers-worker"));
  EngineWorker worker(dir + QStringLiteral("/chats.db"), 2, std::make_shared<LiveStats>());
  QSignalSpy applied(&worker, &EngineWorker::kvTiersApplied);

  // Before a model: kept for the next one.
  KvTierSettings good;
  good.ramBudgetMiB = 256;
  good.spillDir = dir + QStringLiteral("/spill");
  QDir().mkpath(good.spillDir);
  worker.setKvTiers(1, good);
  ASSERT_EQ(applied.count(), 1);
  EXPECT_TRUE(applied.at(0).at(1).toBool());
  EXPECT_TRUE(applied.at(0).at(2).toString().contains(QStringLiteral("next model")));

  QSignalSpy loaded(&worker, &EngineWorker::modelLoaded);
  QSignalSpy failed(&worker, &EngineWorker::modelLoadFailed);
  worker.loadModel(7, guitest::tinyModel(), false);
  ASSERT_EQ(loaded.count(), 1) << (failed.isEmpty() ? std::string()
                                                    : failed.at(0).at(1).toString().toStdString());

  // The engine refuses a policy it does not know (the dialog never offers
  // one; a hand-edited file is cleaned on load): the session stays as it was.
  KvTierSettings bad = good;
  bad.policy = QStringLiteral("fifo");
  worker.setKvTiers(2, bad);
  ASSERT_EQ(applied.count(), 2);
  EXPECT_FALSE(applied.at(1).at(1).toBool());
  EXPECT_TRUE(applied.at(1).at(2).toString().contains(QStringLiteral("fifo")))
      << applied.at(1).at(2).toString().toStdString();

  // The old session is still there: new settings make it again, and the
  // note says what the KV cache may use now.
  KvTierSettings lru = good;
  lru.policy = QStringLiteral("lru");
  lru.spillType = QStringLiteral("q8_0");
  worker.setKvTiers(3, lru);
  ASSERT_EQ(applied.count(), 3);
  EXPECT_TRUE(applied.at(2).at(1).toBool()) << applied.at(2).at(2).toString().toStdString();
  const QString note = applied.at(2).at(2).toString();
  EXPECT_TRUE(note.contains(QStringLiteral("256"))) << note.toStdString();
  EXPECT_TRUE(note.contains(good.spillDir)) << note.toStdString();
  EXPECT_TRUE(note.contains(QStringLiteral("least recently used"))) << note.toStdString();
  EXPECT_TRUE(note.contains(QStringLiteral("q8_0"))) << note.toStdString();
}

// As a user: "KV memory…" in the placement panel, a budget and a folder in
// the dialog, OK; the panel says what the KV cache may use, and the settings
// are in window.ini for the next start.
TEST(KvTiers, TheButtonOpensTheDialogAndTheSessionFollows) {
  const AppOptions o = guitest::appOptions(QStringLiteral("kv-tiers-app"));
  MainWindow w(o);
  w.show();
  QSignalSpy ready(&w, &MainWindow::modelReady);
  w.loadModel(guitest::tinyModel());
  ASSERT_TRUE(QTest::qWaitFor([&] { return ready.count() > 0; }, 120000));

  const QString spill = o.cacheDir + QStringLiteral("/my-spill");
  bool filled = false;
  QTimer::singleShot(100, [&] {
    auto* d = qobject_cast<KvTiersDialog*>(QApplication::activeModalWidget());
    if (!d) return;
    KvTierSettings s;
    s.ramBudgetMiB = 512;
    s.spillDir = spill;
    d->setSettings(s);
    filled = true;
    d->accept();
  });
  PlacementPanel* panel = w.enginePanel()->placementPanel();
  auto* button = panel->findChild<QPushButton*>(QStringLiteral("KvTiersButton"));
  ASSERT_NE(button, nullptr);
  button->click();
  ASSERT_TRUE(filled);
  ASSERT_TRUE(QTest::qWaitFor(
      [&] { return panel->noteText().contains(QStringLiteral("RAM up to")); }, 120000))
      << panel->noteText().toStdString();
  EXPECT_TRUE(panel->noteText().contains(spill)) << panel->noteText().toStdString();
  auto* summary = panel->findChild<QLabel*>(QStringLiteral("KvTiersSummary"));
  ASSERT_NE(summary, nullptr);
  EXPECT_TRUE(summary->toolTip().contains(QStringLiteral("my-spill")) ||
              summary->text().contains(QStringLiteral("my-spill")))
      << summary->text().toStdString();
  const KvTierSettings saved =
      KvTiersDialog::load(QDir(o.dataDir).filePath(QStringLiteral("window.ini")));
  EXPECT_EQ(saved.ramBudgetMiB, 512);
  EXPECT_EQ(saved.spillDir, spill);

  // With tiers, the grid shows where each layer's KV lies, once a reply has
  // put tokens in it: all of it in RAM here (the CPU's attention, 512 MiB).
  EXPECT_EQ(PlacementModel::columnTitle(kColKvTiers), QStringLiteral("KV on"));
  QSignalSpy finished(w.chat(), &ChatController::replyFinished);
  ChatInput* input = w.composer()->input();
  input->setFocus();
  QTest::keyClicks(input, QStringLiteral("Hello there"));
  QTest::keyClick(input, Qt::Key_Return);
  ASSERT_TRUE(QTest::qWaitFor([&] { return finished.count() > 0; }, 120000));
  PlacementModel* pm = w.placement();
  ASSERT_TRUE(QTest::qWaitFor(
      [&] {
        panel->refreshMeasured();
        return pm->data(pm->index(1, kColKvTiers), Qt::DisplayRole).toString() ==
               QStringLiteral("RAM 100%");
      },
      120000))
      << pm->data(pm->index(1, kColKvTiers), Qt::DisplayRole).toString().toStdString();
  EXPECT_FALSE(panel->grid()->isColumnHidden(kColKvTiers));
  EXPECT_TRUE(pm->data(pm->index(0, kColKvTiers), Qt::DisplayRole).isNull());  // the embedding
  const QString tip = pm->data(pm->index(1, kColKvTiers), Qt::ToolTipRole).toString();
  EXPECT_TRUE(tip.contains(QStringLiteral("RAM:")) && tip.contains(QStringLiteral("SSD:")))
      << tip.toStdString();
}

// The per-layer view's text: the tiers that hold any of a layer's KV, as shares.
TEST(KvTiers, TheKvColumnShowsEachLayersShares) {
  PlacementModel pm;
  ModelSummary ms;
  ms.nLayer = 2;
  pm.setApplied(PlacementPlan::allOn(QStringLiteral("cpu"), ms, QStringLiteral("F16"), {}, {}));
  ASSERT_EQ(pm.rowCount(), 4);
  EXPECT_TRUE(pm.data(pm.index(1, kColKvTiers), Qt::DisplayRole).isNull());  // no tiers
  pm.setKvLayers({KvLayerBytes{3 << 20, 1 << 20, 0}, KvLayerBytes{0, 1 << 20, 3 << 20}});
  EXPECT_EQ(pm.data(pm.index(1, kColKvTiers), Qt::DisplayRole).toString(),
            QStringLiteral("GPU 75% RAM 25%"));
  EXPECT_EQ(pm.data(pm.index(2, kColKvTiers), Qt::DisplayRole).toString(),
            QStringLiteral("RAM 25% SSD 75%"));
  EXPECT_TRUE(pm.data(pm.index(3, kColKvTiers), Qt::DisplayRole).isNull());  // the output row
  pm.setKvLayers({KvLayerBytes{}, KvLayerBytes{}});
  EXPECT_EQ(pm.data(pm.index(1, kColKvTiers), Qt::DisplayRole).toString(), QStringLiteral("—"));
}

}  // namespace
