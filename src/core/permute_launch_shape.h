// Launch choices of the permute chain (kernels/permute/permute.cu) that are
// pure functions of its shape, so that tests/cpu/test_permute.cpp can pin
// them.
#pragma once

namespace unimoe::permute_shape {

// Whether the permute's scan kernel lets the scatter launch as soon as the
// scan's own wait is over (programmatic dependent launch), so that the
// scatter's CTAs load their chunk's ids while the scan runs: only where every
// scatter CTA finds an SM the scan leaves free. Measured on an H200 (132 SMs,
// 336 split-chain points, T 64..16384): 0.96 of the time without the trigger
// (geometric mean; 0.3-0.6 us a call), but 1.03 slower at the 8 points where
// 128 scatter CTAs and 8 or 12 scan CTAs (E_local 256 and 384) passed 132,
// every policy at T=16384 K=8 (DeepSeekV3 E=256 22.18 -> 23.00 us);
// E_local = 128 there (4 scan CTAs) gained 0.96. Where the scatter ranks its
// rows before its wait (the token masks of the calls the octet kernel
// counted: `ranks_before_wait`), it triggers whatever the CTAs: measured on
// an H200 (72 split-chain points, DeepSeekV3/MiniMax2 E 128..384, K 4 and 8,
// T 2048..16384), the calls past 132 CTAs 0.93-0.95x with the trigger
// (DeepSeekV3 E=256 K=8 T=16384 21.62 -> 20.70 us, T=8192 16.59 -> 15.30),
// the others unchanged; the votes' scatter, which has nothing to do before
// its wait, stays with the SM rule (Renormalize E=256 K=8 T=16384
// 26.19 -> 27.14 forced).
inline bool scan_triggers_scatter(int scatter_ctas, int scan_ctas, int sm_count,
                                  bool ranks_before_wait) {
  return ranks_before_wait || scatter_ctas + scan_ctas <= sm_count;
}

}  // namespace unimoe::permute_shape
