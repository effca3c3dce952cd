// GoogleTest main for the GUI tests: one QApplication for the whole run,
// offscreen unless the caller chose a platform.
#include <gtest/gtest.h>

#include <QApplication>
#include <QDir>

#include "app/theme.h"

int main(int argc, char** argv) {
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("loom-gui-tests"));
  theme::apply(app);
  testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  // This process's models (see gui_test_util.h) are not needed by anyone else.
  const QString pid = QString::number(QCoreApplication::applicationPid());
  QDir(QStringLiteral(LOOM_GUI_TEST_TMP "/models-") + pid).removeRecursively();
  QDir(QStringLiteral(LOOM_GUI_TEST_TMP "/models12-") + pid).removeRecursively();
  QDir(QStringLiteral(LOOM_GUI_TEST_TMP "/truncated-") + pid).removeRecursively();
  return rc;
}
