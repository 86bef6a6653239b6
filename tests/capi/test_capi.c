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

  printf("C ABI: %s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
