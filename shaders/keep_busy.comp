#version 450
// Keeps the GPU busy while the host computes between two batches (the CPU
// part of a hybrid decode step), so the driver does not lower the GPU's clocks
// for lack of work and the next batch runs at full speed. One thread polls a
// host-visible word until the host sets it (it does so as it starts recording
// the next batch) or max_polls polls have passed; each poll reads host memory
// across the bus and then spins a little, so the cap is tens of milliseconds.
#include "common.glsl"

layout(binding = 0) coherent volatile buffer F { uint flag[]; };

layout(push_constant) uniform PC {
  uint off;        // the word (uint index)
  uint max_polls;
  uint spin;       // dependent multiply-adds between polls
} pc;

void main() {
  float a = 1.0;
  for (uint i = 0; i < pc.max_polls; ++i) {
    if (flag[pc.off] != 0u) break;
    for (uint k = 0; k < pc.spin; ++k) a = a * 0.999 + 0.001;
  }
  if (a < 0.0) flag[pc.off + 1] = 1u;  // never: keeps the spin from being removed
}
