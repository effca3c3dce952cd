// GoogleTest main for the GUI tests: one QApplication for the whole run,
// offscreen unless the caller chose a platform.
#include <gtest/gtest.h>

#include <QApplication>

#include "app/theme.h"

int main(int argc, char** argv) {
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("loom-gui-tests"));
  theme::apply(app);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
