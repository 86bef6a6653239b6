// The launch shape of the fused and cluster routing kernels
// (kernels/fused_routing.cu): threads a block, routing CTAs a cluster, and
// which way the cluster kernel routes. Host and device (UNIMOE_HD), no CUDA
// headers: the launcher and the kernel call these, and
// tests/cpu/test_routing_launch_shape.cpp pins the bounds that the GPU tests
// are written against (a GPU test that compares outputs cannot tell which
// way served it).
#pragma once

#include "core/host_device.h"
#include "core/routing_shape_fused.h"
#include "core/routing_shape_split.h"
#include "core/routing_shape_choice.h"
