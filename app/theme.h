// One palette for the whole app: surfaces, text, accent, and the colours that
// mean something (a backend, a memory tier, a percentile) so that the grid,
// the charts and the devices list agree.
#pragma once

#include <QColor>
#include <QFont>
#include <QString>

class QApplication;

namespace theme {

// Surfaces and text.
inline const QColor kWindow{0xff, 0xff, 0xff};
inline const QColor kSidebar{0xf6, 0xf7, 0xf9};
inline const QColor kPanel{0xfa, 0xfb, 0xfc};
inline const QColor kBorder{0xe4, 0xe7, 0xec};
inline const QColor kText{0x1d, 0x21, 0x29};
inline const QColor kMuted{0x6b, 0x72, 0x80};
inline const QColor kAccent{0x4f, 0x46, 0xe5};
inline const QColor kAccentSoft{0xee, 0xf0, 0xff};
inline const QColor kUserBubble{0xf0, 0xf2, 0xf8};
inline const QColor kCodeBg{0xf6, 0xf8, 0xfa};
inline const QColor kDanger{0xdc, 0x26, 0x26};
inline const QColor kWarningBg{0xff, 0xf7, 0xe6};

// Backends and the memory tiers they own (a GPU backend's colour is the GPU tier's).
inline const QColor kCpu{0x14, 0xa3, 0x8b};
inline const QColor kVulkan{0x8b, 0x5c, 0xf6};
inline const QColor kCuda{0x65, 0xa3, 0x0d};
inline const QColor kTierGpu = kVulkan;
inline const QColor kTierRam = kCpu;
inline const QColor kTierSsd{0xf5, 0x9e, 0x0b};

// Latency marks.
inline const QColor kP50{0x25, 0x63, 0xeb};
inline const QColor kP99{0xe1, 0x1d, 0x48};

/// The colour of a backend kind ("cpu", "vulkan", "cuda"; ids like "vulkan:0" too).
QColor backendColor(const QString& kindOrId);

/// UI and code fonts (Inter / DejaVu Sans Mono when installed).
QFont uiFont(qreal pointSize = 10.0);
QFont monoFont(qreal pointSize = 9.5);

/// Palette, fonts and style sheet for the application.
void apply(QApplication& app);

/// CSS colour text ("#rrggbb") for style sheets and HTML.
inline QString css(const QColor& c) {
  return c.name(QColor::HexRgb);
}

}  // namespace theme
