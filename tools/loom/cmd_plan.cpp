// `loom plan`: the placement a strategy makes for a model, without running it.
#include <cstdio>

#include "tools/loom/engine_setup.h"
#include "tools/loom/plan_print.h"

namespace loom::cli {

int cmd_plan(const PlanOptions& o) {
  auto e = open_engine(o.engine, "loom plan", /*calibrate=*/true, /*session=*/false);
  if (!e) return 1;
  if (!o.save.empty()) {
    Status s = e->planned.save(o.save);
    if (!s.ok()) {
      std::fprintf(stderr, "loom plan: %s\n", s.message().c_str());
      return 1;
    }
  }
  if (o.json) {
    std::printf("%s\n", e->planned.to_json().c_str());
    return 0;
  }
  print_plan(*e, nullptr, stdout);
  return 0;
}

}  // namespace loom::cli
