// The launch-shape rules of the routing kernels, host and device
// (UNIMOE_HD), no CUDA headers; this header includes the three parts below.
//
// The launchers and the kernels call these rules, and the CPU tests
// (tests/cpu/test_routing_*.cpp) pin the bounds that the GPU tests are
// written against (a GPU test that compares outputs cannot tell which way
// served it). By family:
//   - core/routing_shape_fused.h: the fused block, cluster and spread
//     kernels (kernels/routing/fused_routing.cu);
//   - core/routing_shape_split.h: the split chain (weights in batches,
//     sorted runs, the octet kernel);
//   - core/routing_shape_choice.h: the decode kernels' choices (threshold,
//     fixed, wide) and the cluster defaults that depend on them.
#pragma once

#include "core/host_device.h"
#include "core/routing_shape_fused.h"
#include "core/routing_shape_split.h"
#include "core/routing_shape_choice.h"
