// The per-layer placement table `loom plan` prints (and `loom bench` next to
// measured figures).
#pragma once

#include <cstdio>
#include <vector>

#include "engine/profile/profiler.h"
#include "tools/loom/engine_setup.h"

namespace loom::cli {

/// Prints the placement of `e` (e.planned), bytes per unit and the cost
/// model's prediction; with `measured`, each layer's measured P50/P99 too.
void print_plan(const Engine& e, const Profiler::Snapshot* measured, FILE* f);

}  // namespace loom::cli
