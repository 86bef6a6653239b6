// The prepared layout of 4-bit (MXFP4, NVFP4) weights: the order of the e2m1
// nibbles inside each 32-bit word, chosen so that the W4A16 kernels turn a
// word into four bf16 pairs with two shifts, one lop3 and one bf16 multiply
// a pair. The same code on host and device.
//
// A checkpoint word (4 consecutive bytes of a row) holds 8 consecutive K
// values j = 0..7, value j in bits 4j..4j+3 as s e e m (bit 3 the sign).
// The prepared word keeps the same 8 values in the same word; value j goes
// to half h = j % 2 (bits 16h..16h+15) as slot v = j / 2:
//
//   bit of the half  15 14 13 12 | 11 10 9 | 8 7 6 | 5 4 3 | 2 1 0
//   holds            s3 s2 s1 s0 |   m3    |  m2   |  m1   |  m0
//
// sv is value (2v + h)'s sign, mv its three magnitude bits e e m. Pair v of
// the word (values 2v and 2v + 1, the low and high bf16 of a bf16x2) is then
//   bits = ((word << (6 - 3v)) & 0x01C001C0) | ((word << (3 - v)) & 0x80008000)
// (a right shift by 3 for v = 3): each half's mv lands on bf16 bits 8..6
// (the two low exponent bits and the top mantissa bit) and sv on bit 15, so
// that bits, read as bf16, is the e2m1 value times 2^-126 exactly (e = 0
// gives the bf16 subnormal m * 2^-127, e2m1's 0.5 * m scaled alike). The
// kernels multiply by 2^126 times the block scale in one bf16 multiply.
//
// Rows, their order and the bytes of a row are the checkpoint's; only the
// nibbles inside each word move, so K must be a multiple of 8 (the kernels
// need 32).
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace unimoe {

// Checkpoint word -> prepared word.
UNIMOE_HD uint32_t fp4_prepare_word(uint32_t w) {
  uint32_t out = 0;
  for (int j = 0; j < 8; ++j) {
    const uint32_t nibble = (w >> (4 * j)) & 0xfu;
    const int h = j % 2, v = j / 2;
    out |= (nibble & 0x7u) << (16 * h + 3 * v);
    out |= (nibble >> 3) << (16 * h + 12 + v);
  }
  return out;
}

// Prepared word -> checkpoint word (the inverse).
UNIMOE_HD uint32_t fp4_unprepare_word(uint32_t p) {
  uint32_t out = 0;
  for (int j = 0; j < 8; ++j) {
    const int h = j % 2, v = j / 2;
    const uint32_t magnitude = (p >> (16 * h + 3 * v)) & 0x7u;
    const uint32_t sign = (p >> (16 * h + 12 + v)) & 0x1u;
    out |= (magnitude | sign << 3) << (4 * j);
  }
  return out;
}

// The bf16x2 bits of pair v (0..3) of a prepared word: values 2v (low half)
// and 2v + 1 (high half), each the e2m1 value times 2^-126.
UNIMOE_HD uint32_t fp4_pair_bits(uint32_t p, int v) {
  const uint32_t magnitude = v < 3 ? p << (6 - 3 * v) : p >> 3;
  return (magnitude & 0x01C001C0u) | ((p << (3 - v)) & 0x80008000u);
}

}  // namespace unimoe
