#include "core/weight_fields.h"

#include <string>

namespace unimoe {

void check_quant_weight_fields(const MoEConfig& config, const ExpertWeights& w) {
  const QuantVariant q = config.experts.quant;
  const bool fp8 = q == QuantVariant::FP8Block128 || q == QuantVariant::FP8PerTensor;
  const bool w4 = q == QuantVariant::MXFP4 || q == QuantVariant::NVFP4;
  const bool matrix_scales = fp8 || q == QuantVariant::NVFP4;
  const std::string variant = "quant " + to_string(q);
  if (matrix_scales && (!w.w13_scale || !w.w2_scale))
    throw Error(!w.w13_scale ? "weights.w13_scale" : "weights.w2_scale",
                variant + " needs the weight scales w13_scale and w2_scale" +
                    (fp8 ? "" : " (one fp32 scale per expert and matrix)"));
  if (!matrix_scales && (w.w13_scale || w.w2_scale))
    throw Error(w.w13_scale ? "weights.w13_scale" : "weights.w2_scale",
                variant + " has no fp32 weight scales; set them only for the FP8 variants and NVFP4" +
                    (w4 ? " (MXFP4's scales are the e8m0 block scales)" : ""));
  if (w4 && (!w.w13_block_scale || !w.w2_block_scale))
    throw Error(!w.w13_block_scale ? "weights.w13_block_scale" : "weights.w2_block_scale",
                variant + " needs the block scales w13_block_scale and w2_block_scale");
  if (!w4 && (w.w13_block_scale || w.w2_block_scale))
    throw Error(w.w13_block_scale ? "weights.w13_block_scale" : "weights.w2_block_scale",
                variant + " has no block scales; set them only for MXFP4 and NVFP4");
  if (!w4 && w.w13_interleaved)
    throw Error("weights.w13_interleaved",
                variant + " reads w13 as given: reorder interleaved gate/up rows to gate rows "
                          "then up rows (MXFP4 and NVFP4 reorder them in set_weights)");
  if (w.w13_interleaved && config.gemm1_cols() != 2 * config.experts.intermediate)
    throw Error("weights.w13_interleaved",
                "needs a gated activation (w13 holds gate and up rows); " +
                    to_string(config.experts.activation) + " has one set of rows");
  if (q != QuantVariant::FP8PerTensor && (w.x_scale || w.act_scale))
    throw Error(w.x_scale ? "weights.x_scale" : "weights.act_scale",
                variant + " takes no static activation scale (FP8PerTensor only); " +
                    (fp8 ? "FP8Block128 computes one per token and 128 columns" : "leave it null"));
}

}  // namespace unimoe
