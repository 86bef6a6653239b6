/* unimoe's C ABI: the layer of unimoe.h behind plain C functions, for
 * bindings that load a shared library (the Python package loads
 * libunimoe_c.so with ctypes) and for code that cannot take C++ exceptions.
 *
 * Rules every function follows:
 *   - it returns a status, UNIMOE_OK or one of the error codes below, and
 *     never lets an exception out;
 *   - on an error, unimoe_last_error() gives the message and
 *     unimoe_last_error_field() the field an unimoe::Error names (empty for
 *     other errors); both are kept per thread until that thread's next
 *     failing call;
 *   - a string it returns through `const char** out` is owned by the
 *     library, kept per thread, and valid until the next call of this ABI on
 *     that thread: copy it before calling again;
 *   - pointers are device pointers for the GPU layer, host pointers for the
 *     CPU reference; a null pointer is "not given".
 * Configs travel in their one-line text form (MoEConfig::to_string / parse).
 */
#ifndef UNIMOE_UNIMOE_C_H_
#define UNIMOE_UNIMOE_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The functions are the shared library's only exported symbols. */
#if defined(__GNUC__)
#define UNIMOE_C_API __attribute__((visibility("default")))
#else
#define UNIMOE_C_API
#endif

/* Bumped when a function's signature or meaning, or a struct's layout,
 * changes. */
#define UNIMOE_C_ABI_VERSION 3

typedef enum unimoe_status {
  UNIMOE_OK = 0,
  UNIMOE_ERROR_VALUE = 1,        /* unimoe::Error: a bad value; the field names it */
  UNIMOE_ERROR_RUNTIME = 2,      /* the device, CUDA or another runtime failure */
  UNIMOE_ERROR_UNSUPPORTED = 3,  /* this build has no CUDA library */
} unimoe_status;

/* A GPU layer (unimoe::MoELayer). */
typedef struct unimoe_layer unimoe_layer;
typedef struct unimoe_ep unimoe_ep;

/* The weights, as unimoe::ExpertWeights: shapes, dtypes and alignment as
 * unimoe.h documents them (MXFP4 and NVFP4: packed e2m1 codes in w13 and
 * w2, their scale bytes in the block scales, w13_interleaved != 0 for
 * gpt-oss's alternating gate and up rows). Zero-initialize it: a null
 * pointer or 0 is "not given". */
typedef struct unimoe_weights {
  const void* w13;
  const void* w2;
  const float* b13;
  const float* b2;
  const float* w13_scale;
  const float* w2_scale;
  const float* x_scale;    /* FP8PerTensor: static activation scales, positive and finite */
  const float* act_scale;
  const uint8_t* w13_block_scale;
  const uint8_t* w2_block_scale;
  int w13_interleaved;
} unimoe_weights;

UNIMOE_C_API int unimoe_abi_version(void);
UNIMOE_C_API const char* unimoe_version(void);
/* 1 when this build has the CUDA library (the GPU layer), 0 otherwise. */
UNIMOE_C_API int unimoe_has_cuda(void);
UNIMOE_C_API const char* unimoe_last_error(void);
UNIMOE_C_API const char* unimoe_last_error_field(void);

/* ---- configs ---- */

/* The text form of MoEConfig::parse(text), printed again; with validate != 0
 * also unimoe::validate. */
UNIMOE_C_API int unimoe_config_normalize(const char* text, int validate, const char** out);

/* The text form of config_from_hf_json (unimoe/hf_config.h): the MoEConfig
 * of the routed experts of a Hugging Face config.json's text. */
UNIMOE_C_API int unimoe_config_from_hf_json(const char* json_text, const char** out);

/* ---- the GPU layer ---- */

/* MoELayer::create on the device current on this thread. */
UNIMOE_C_API int unimoe_layer_create(const char* config_text, int max_tokens,
                                     unimoe_layer** out);
/* MoELayer::scratch_bytes and MoELayer::create with a scratch: the layer's
 * per-call buffers in the caller's device memory `scratch` (256-byte
 * aligned, at least unimoe_layer_scratch_bytes bytes), which layers that
 * forward one after another may share; the caller keeps it until every
 * layer made with it is destroyed. */
UNIMOE_C_API int unimoe_layer_scratch_bytes(const char* config_text, int max_tokens, size_t* out);
UNIMOE_C_API int unimoe_layer_create_with_scratch(const char* config_text, int max_tokens,
                                                  void* scratch, size_t scratch_size,
                                                  unimoe_layer** out);
/* Does nothing for a null layer. */
UNIMOE_C_API void unimoe_layer_destroy(unimoe_layer* layer);
UNIMOE_C_API int unimoe_layer_set_weights(unimoe_layer* layer, const unimoe_weights* weights);
/* ForwardArgs; stream is a cudaStream_t (null: the legacy default stream). */
UNIMOE_C_API int unimoe_layer_forward(unimoe_layer* layer, int num_tokens, const void* x,
                                      const void* logits, const float* routing_bias,
                                      const int32_t* topk_ids, const float* topk_weights,
                                      void* out, void* stream);
UNIMOE_C_API int unimoe_layer_describe(const unimoe_layer* layer, int num_tokens,
                                       const char** out);
UNIMOE_C_API int unimoe_layer_workspace_bytes(const unimoe_layer* layer, size_t* out);
UNIMOE_C_API int unimoe_layer_use_tuning_cache(unimoe_layer* layer, const char* path,
                                               const char** out);
/* AutotuneOptions as arguments: tokens[num_tokens_list] (none: every
 * bucket), routing "uniform", "skewed", "zipf:S" or "hot:P", iters, check_tokens, cache_path
 * (null or empty: none); quiet != 0 drops the progress lines that otherwise
 * go to stderr. out: the per-bucket report. */
UNIMOE_C_API int unimoe_layer_autotune(unimoe_layer* layer, const int* tokens,
                                       int num_tokens_list, const char* routing, int iters,
                                       int check_tokens, const char* cache_path, int quiet,
                                       const char** out);

/* ---- expert parallelism (unimoe/ep.h, docs/expert-parallel.md) ----
 * One rank of a group over NCCL, one process a GPU. The layer makes its own
 * NCCL communicator from an id that one rank draws and every rank passes
 * (share its bytes as you like: torch.distributed, a file). */

/* Empty (*out = "") when NCCL can be loaded in this process, else why not. */
UNIMOE_C_API int unimoe_nccl_support(const char** out);
/* A new NCCL unique id: id_bytes (128) bytes into id. */
UNIMOE_C_API int unimoe_nccl_unique_id(void* id, size_t id_bytes);
/* EPLayer::create over a communicator of world_size ranks made from `id`
 * on the device current on this thread (every rank calls it; it returns
 * once all have). config_text: the whole model's layer. */
UNIMOE_C_API int unimoe_ep_create(const char* config_text, int max_tokens, const void* id,
                                  size_t id_bytes, int world_size, int rank, unimoe_ep** out);
/* EPLayer::scratch_bytes and EPLayer::create with a scratch: the EP buffers
 * and the local layer's per-call buffers in the caller's device memory
 * `scratch` (256-byte aligned, at least unimoe_ep_scratch_bytes bytes),
 * which the EP layers of one model on this rank may share when their
 * forwards run one after another. The caller keeps it until the layers are
 * destroyed. */
UNIMOE_C_API int unimoe_ep_scratch_bytes(const char* config_text, int max_tokens, int world_size,
                                         size_t* out);
UNIMOE_C_API int unimoe_ep_create_with_scratch(const char* config_text, int max_tokens,
                                               const void* id, size_t id_bytes, int world_size,
                                               int rank, void* scratch, size_t scratch_size,
                                               unimoe_ep** out);
/* Does nothing for a null layer. Frees the layer's buffers at once; its
 * communicator too, unless a forward of it was captured in a CUDA graph:
 * NCCL frees a communicator only once every graph that captured its
 * operations is destroyed, so that one is destroyed on a thread of its
 * own, which returns when those graphs are gone (destroying the layer
 * before its graphs does not block). Such a graph must not be replayed
 * after the layer is destroyed. */
UNIMOE_C_API void unimoe_ep_destroy(unimoe_ep* layer);
/* This rank's experts (EPLayer::set_weights). */
UNIMOE_C_API int unimoe_ep_set_weights(unimoe_ep* layer, const unimoe_weights* weights);
/* EPLayer::forward: as unimoe_layer_forward, with this rank's tokens;
 * every rank must call it. */
UNIMOE_C_API int unimoe_ep_forward(unimoe_ep* layer, int num_tokens, const void* x,
                                   const void* logits, const float* routing_bias,
                                   const int32_t* topk_ids, const float* topk_weights, void* out,
                                   void* stream);
/* The layer over this rank's experts (EPLayer::local_layer), for
 * describe, workspace_bytes, use_tuning_cache and autotune; owned by the
 * EP layer: do not destroy it. */
UNIMOE_C_API int unimoe_ep_local_layer(unimoe_ep* layer, unimoe_layer** out);
/* EPLayer::bytes_sent_per_call and buffer_bytes. */
UNIMOE_C_API int unimoe_ep_bytes(const unimoe_ep* layer, size_t* sent_per_call,
                                 size_t* buffer_bytes);

/* ---- the CPU reference ----
 * ref::moe_forward on host memory, with the quantization emulation of the
 * config's variant (BF16, FP8Block128, FP8PerTensor, MXFP4 or NVFP4;
 * 4-bit weights dequantized exactly, interleaved w13 rows and b13 put in
 * gate-then-up order): the output the GPU layer must match, slowly.
 * Inputs as for the GPU layer but in host memory: x [T, H] bf16, logits
 * [T, E] fp32 or bf16 (the config's logits type), routing_bias [E] fp32,
 * or topk_ids [T, K] int32 with topk_weights [T, K] fp32; weights as
 * unimoe_weights (FP8PerTensor with null x_scale or act_scale computes
 * that scale per call, as the layer does); out [T, H] bf16, rounded once
 * from the reference's fp32 result. threads 0: all cores. */
UNIMOE_C_API int unimoe_ref_forward(const char* config_text, int num_tokens, const void* x,
                                    const void* logits, const float* routing_bias,
                                    const int32_t* topk_ids, const float* topk_weights,
                                    const unimoe_weights* weights, void* out, int threads);

#ifdef __cplusplus
}
#endif

#endif /* UNIMOE_UNIMOE_C_H_ */
