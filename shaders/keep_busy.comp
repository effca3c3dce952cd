#version 450
// Keeps the GPU busy while the host computes between two batches (the CPU
// part of a hybrid decode step), so the driver does not lower the GPU's clocks
// for lack of work and the next batch runs at full speed. Every workgroup
// spins on multiply-adds; its first thread polls a host-visible word between
// spins, until the host sets it (it does so as it starts recording the next
// batch) or max_polls polls have passed. A poll reads host memory across the
// bus, so the cap is tens of milliseconds.
#include "common.glsl"

layout(binding = 0) coherent volatile buffer F { uint flag[]; };

layout(push_constant) uniform PC {
  uint off;        // the word (uint index)
  uint max_polls;
  uint spin;       // dependent multiply-adds between polls
} pc;

shared uint stop_sh;

void main() {
  float a = 1.0 + float(gl_LocalInvocationID.x);
  for (uint i = 0; i < pc.max_polls; ++i) {
    if (gl_LocalInvocationID.x == 0) stop_sh = flag[pc.off];
    barrier();
    const bool stop = stop_sh != 0u;
    barrier();
    if (stop) break;
    for (uint k = 0; k < pc.spin; ++k) a = a * 0.999 + 0.001;
  }
  if (a < 0.0) flag[pc.off + 1] = 1u;  // never: keeps the spin from being removed
}
