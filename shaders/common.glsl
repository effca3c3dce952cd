// Shared by every Loom compute shader: extensions, the workgroup-size
// specialization constant, and workgroup reductions.
//
// Variants (shaders/variants.txt) define:
//   USE_SUBGROUP      the device has subgroup arithmetic in compute shaders:
//                     reductions go subgroup first, then across subgroups
//                     through shared memory. Without it, a shared-memory tree.
//   USE_F16_STORAGE   the device has storageBuffer16BitAccess: F16 data is read
//                     as f16vec4; without it, as uint words and unpackHalf2x16.
// Buffers are bound whole (one VkBuffer per memory block); every offset comes
// in push constants, counted in the unit of the view it indexes.
#extension GL_EXT_control_flow_attributes : enable
#ifdef USE_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#ifdef USE_F16_STORAGE
#extension GL_EXT_shader_16bit_storage : require
#endif

// Threads per workgroup; a power of two (the tree reductions rely on it).
layout(constant_id = 0) const uint WG = 128;
layout(local_size_x_id = 0) in;

// The linear workgroup index of a grid that may spill from x into z
// (maxComputeWorkGroupCount[0] is only guaranteed to be 65535).
uint linear_group() { return gl_WorkGroupID.z * gl_NumWorkGroups.x + gl_WorkGroupID.x; }

// Large finite stand-in for -inf: exp(a - b) stays 0 and never NaN.
const float NEG_BIG = -1.0e30;

#ifdef RED_N
// Reduces RED_N values per thread across the workgroup at once. Every thread
// of the workgroup must call these (they contain barriers), with uniform control flow.
#ifdef USE_SUBGROUP
// One slot per subgroup; subgroups are at least 4 wide on every device we meet.
shared float red_sh[RED_N][WG / 4];
void wg_sum_n(inout float v[RED_N]) {
  [[unroll]] for (uint i = 0; i < RED_N; ++i) v[i] = subgroupAdd(v[i]);
  if (subgroupElect()) {
    [[unroll]] for (uint i = 0; i < RED_N; ++i) red_sh[i][gl_SubgroupID] = v[i];
  }
  barrier();
  [[unroll]] for (uint i = 0; i < RED_N; ++i) {
    float s = 0.0;
    for (uint g = 0; g < gl_NumSubgroups; ++g) s += red_sh[i][g];
    v[i] = s;
  }
  barrier();
}
void wg_max_n(inout float v[RED_N]) {
  [[unroll]] for (uint i = 0; i < RED_N; ++i) v[i] = subgroupMax(v[i]);
  if (subgroupElect()) {
    [[unroll]] for (uint i = 0; i < RED_N; ++i) red_sh[i][gl_SubgroupID] = v[i];
  }
  barrier();
  [[unroll]] for (uint i = 0; i < RED_N; ++i) {
    float s = NEG_BIG;
    for (uint g = 0; g < gl_NumSubgroups; ++g) s = max(s, red_sh[i][g]);
    v[i] = s;
  }
  barrier();
}
#else
shared float red_sh[RED_N][WG];
void wg_sum_n(inout float v[RED_N]) {
  const uint tid = gl_LocalInvocationID.x;
  [[unroll]] for (uint i = 0; i < RED_N; ++i) red_sh[i][tid] = v[i];
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (tid < s) {
      [[unroll]] for (uint i = 0; i < RED_N; ++i) red_sh[i][tid] += red_sh[i][tid + s];
    }
    barrier();
  }
  [[unroll]] for (uint i = 0; i < RED_N; ++i) v[i] = red_sh[i][0];
  barrier();
}
void wg_max_n(inout float v[RED_N]) {
  const uint tid = gl_LocalInvocationID.x;
  [[unroll]] for (uint i = 0; i < RED_N; ++i) red_sh[i][tid] = v[i];
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (tid < s) {
      [[unroll]] for (uint i = 0; i < RED_N; ++i) red_sh[i][tid] = max(red_sh[i][tid], red_sh[i][tid + s]);
    }
    barrier();
  }
  [[unroll]] for (uint i = 0; i < RED_N; ++i) v[i] = red_sh[i][0];
  barrier();
}
#endif
#endif
