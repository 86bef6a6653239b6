/* The C ABI from C (C99, -Werror): include/unimoe/unimoe_c.h compiles as C,
 * and libunimoe_c.so's functions return the documented statuses, errors and
 * strings. Built and run by tests/scripts/test_capi_c.sh. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "unimoe/unimoe_c.h"

static int failures = 0;

#define EXPECT(cond)                                                   \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                      \
    }                                                                  \
  } while (0)

/* bf16 bits of a float that bf16 holds exactly. */
static unsigned short bf16(float v) {
  unsigned int bits;
  memcpy(&bits, &v, sizeof bits);
  return (unsigned short)(bits >> 16);
}

static float from_bf16(unsigned short b) {
  unsigned int bits = (unsigned int)b << 16;
  float v;
  memcpy(&v, &bits, sizeof v);
  return v;
}

int main(void) {
  const char* text = NULL;
  EXPECT(unimoe_abi_version() == UNIMOE_C_ABI_VERSION);
  EXPECT(strcmp(unimoe_version(), "") != 0);

  /* configs: normalized text, and an error naming its field */
  EXPECT(unimoe_config_normalize("E=8 K=2 H=64 I=32", 1, &text) == UNIMOE_OK);
  EXPECT(strncmp(text, "policy=Renormalize E=8 K=2 ", 27) == 0);
  EXPECT(unimoe_config_normalize("E=8 K=9 H=64 I=32", 1, &text) == UNIMOE_ERROR_VALUE);
  EXPECT(strcmp(unimoe_last_error_field(), "routing.top_k") == 0);
  EXPECT(strstr(unimoe_last_error(), "top_k") != NULL);
  EXPECT(unimoe_config_normalize("policy=Nope", 0, &text) == UNIMOE_ERROR_VALUE);
  EXPECT(strcmp(unimoe_last_error_field(), "routing.policy") == 0);
  EXPECT(unimoe_config_normalize(NULL, 0, &text) == UNIMOE_ERROR_VALUE);
  EXPECT(strcmp(unimoe_last_error_field(), "config") == 0);

  /* the CPU reference: one token, K = 1, expert 1 chosen; w13 = 1 on the
   * diagonal of gate and up, w2 = the identity: out = silu(x) * x */
  enum { E = 2, H = 8, I = 8 };
  static unsigned short w13[E][2 * I][H], w2[E][H][I], x[H], out[H];
  float logits[E] = {0.0f, 1.0f};
  for (int e = 0; e < E; ++e)
    for (int j = 0; j < I; ++j) {
      w13[e][j][j] = w13[e][I + j][j] = bf16(1.0f);
      w2[e][j][j] = bf16(1.0f);
    }
  for (int j = 0; j < H; ++j) x[j] = bf16((float)j - 3.0f);
  unimoe_weights w;
  memset(&w, 0, sizeof w);
  w.w13 = w13;
  w.w2 = w2;
  const char* cfg = "policy=Renormalize E=2 K=1 H=8 I=8";
  EXPECT(unimoe_ref_forward(cfg, 1, x, logits, NULL, NULL, NULL, &w, out, 1) == UNIMOE_OK);
  for (int j = 0; j < H; ++j) {
    const double v = (double)j - 3.0, a = from_bf16(bf16((float)(v / (1.0 + exp(-v)) * v)));
    EXPECT(fabs(from_bf16(out[j]) - a) <= fabs(a) / 128.0);
  }
  EXPECT(unimoe_ref_forward(cfg, 1, x, NULL, NULL, NULL, NULL, &w, out, 1) == UNIMOE_ERROR_VALUE);
  EXPECT(strcmp(unimoe_last_error_field(), "args") == 0);
  w.w2 = NULL;
  EXPECT(unimoe_ref_forward(cfg, 1, x, logits, NULL, NULL, NULL, &w, out, 1) == UNIMOE_ERROR_VALUE);
  EXPECT(strcmp(unimoe_last_error_field(), "weights.w2") == 0);

  /* MXFP4 with gpt-oss's interleaved rows (gate j at row 2j, up j at row
   * 2j + 1): code 0x2 (1.0) on the diagonals, every block scale 127 (2^0),
   * so the same silu(x) * x */
  enum { H4 = 32, I4 = 32 };
  static unsigned char c13[E][2 * I4][H4 / 2], c2[E][H4][I4 / 2];
  static unsigned char s13[E][2 * I4][H4 / 32], s2[E][H4][I4 / 32];
  static unsigned short x4[H4], out4[H4];
  memset(s13, 127, sizeof s13);
  memset(s2, 127, sizeof s2);
  for (int e = 0; e < E; ++e)
    for (int j = 0; j < I4; ++j) {
      const unsigned char one = (unsigned char)(0x2 << (4 * (j % 2)));
      c13[e][2 * j][j / 2] |= one;
      c13[e][2 * j + 1][j / 2] |= one;
      c2[e][j][j / 2] |= one;
    }
  for (int j = 0; j < H4; ++j) x4[j] = bf16((float)j - 3.0f);
  unimoe_weights w4;
  memset(&w4, 0, sizeof w4);
  w4.w13 = c13;
  w4.w2 = c2;
  w4.w13_block_scale = &s13[0][0][0];
  w4.w2_block_scale = &s2[0][0][0];
  w4.w13_interleaved = 1;
  const char* cfg4 = "policy=Renormalize E=2 K=1 H=32 I=32 quant=MXFP4";
  EXPECT(unimoe_ref_forward(cfg4, 1, x4, logits, NULL, NULL, NULL, &w4, out4, 1) == UNIMOE_OK);
  for (int j = 0; j < H4; ++j) {
    const double v = (double)j - 3.0, a = from_bf16(bf16((float)(v / (1.0 + exp(-v)) * v)));
    EXPECT(fabs(from_bf16(out4[j]) - a) <= fabs(a) / 128.0);
  }
  w4.w2_block_scale = NULL;
  EXPECT(unimoe_ref_forward(cfg4, 1, x4, logits, NULL, NULL, NULL, &w4, out4, 1) ==
         UNIMOE_ERROR_VALUE);
  EXPECT(strcmp(unimoe_last_error_field(), "weights.w2_block_scale") == 0);

  /* the GPU layer: refused with a runtime error where there is no GPU or
   * no CUDA library; a null layer is an error naming it */
  unimoe_layer* layer = NULL;
  const int created = unimoe_layer_create(cfg, 4, &layer);
  if (created == UNIMOE_OK) {
    size_t bytes = 0;
    EXPECT(unimoe_layer_workspace_bytes(layer, &bytes) == UNIMOE_OK && bytes > 0);
    EXPECT(unimoe_layer_describe(layer, 1, &text) == UNIMOE_OK && strncmp(text, "path=", 5) == 0);
    unimoe_layer_destroy(layer);
  } else {
    EXPECT(created == UNIMOE_ERROR_RUNTIME || created == UNIMOE_ERROR_UNSUPPORTED);
    EXPECT(layer == NULL);
    printf("no GPU layer here: %s\n", unimoe_last_error());
  }
  EXPECT(unimoe_layer_describe(NULL, 1, &text) == UNIMOE_ERROR_VALUE);
  EXPECT(strcmp(unimoe_last_error_field(), "layer") == 0);
  unimoe_layer_destroy(NULL);

  /* expert parallelism: refusals name their field before anything needs
   * NCCL or a GPU; a null EP layer is an error naming it */
  unsigned char id[128];
  memset(id, 0, sizeof id);
  unimoe_ep* ep = NULL;
  size_t n = 0;
  EXPECT(unimoe_nccl_support(&text) == UNIMOE_OK && text != NULL);
  if (unimoe_has_cuda()) {
    EXPECT(unimoe_ep_create(cfg, 4, id, sizeof id, 0, 0, &ep) == UNIMOE_ERROR_VALUE);
    EXPECT(strcmp(unimoe_last_error_field(), "world_size") == 0);
    EXPECT(unimoe_ep_create(cfg, 4, id, sizeof id, 2, 2, &ep) == UNIMOE_ERROR_VALUE);
    EXPECT(strcmp(unimoe_last_error_field(), "rank") == 0);
    EXPECT(unimoe_ep_create(cfg, 4, NULL, sizeof id, 1, 0, &ep) == UNIMOE_ERROR_VALUE);
    EXPECT(strcmp(unimoe_last_error_field(), "id") == 0);
    EXPECT(unimoe_nccl_unique_id(NULL, sizeof id) != UNIMOE_OK);
    EXPECT(unimoe_ep_scratch_bytes(cfg, 4, 0, &n) == UNIMOE_ERROR_VALUE);
    EXPECT(strcmp(unimoe_last_error_field(), "world_size") == 0);
    EXPECT(unimoe_ep_scratch_bytes(cfg, 4, 1, NULL) == UNIMOE_ERROR_VALUE);
    EXPECT(strcmp(unimoe_last_error_field(), "out") == 0);
    EXPECT(unimoe_ep_create_with_scratch(cfg, 4, id, sizeof id, 1, 1, NULL, 0, &ep) ==
           UNIMOE_ERROR_VALUE);
    EXPECT(strcmp(unimoe_last_error_field(), "rank") == 0);
    EXPECT(unimoe_ep_create_with_scratch(cfg, 4, id, sizeof id, 1, 0, NULL, 0, &ep) != UNIMOE_OK);
  } else {
    EXPECT(unimoe_ep_create(cfg, 4, id, sizeof id, 1, 0, &ep) == UNIMOE_ERROR_UNSUPPORTED);
    EXPECT(unimoe_ep_scratch_bytes(cfg, 4, 1, &n) == UNIMOE_ERROR_UNSUPPORTED);
    EXPECT(unimoe_ep_create_with_scratch(cfg, 4, id, sizeof id, 1, 0, NULL, 0, &ep) ==
           UNIMOE_ERROR_UNSUPPORTED);
  }
  EXPECT(ep == NULL);
  EXPECT(unimoe_ep_set_weights(NULL, &w) != UNIMOE_OK);
  EXPECT(unimoe_ep_bytes(NULL, NULL, NULL) != UNIMOE_OK);
  unimoe_ep_destroy(NULL);

  printf("C ABI: %s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
