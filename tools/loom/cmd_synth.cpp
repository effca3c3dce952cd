#include "tools/loom/commands.h"
#include <cstdio>
namespace loom::cli {
int cmd_synth(const SynthOptions&) { std::fprintf(stderr, "not built yet\n"); return 1; }
}
