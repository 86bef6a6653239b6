// The activations between the GEMMs, in fp64. A NaN input stays NaN (every
// comparison below lets it through), as it does on the device.
#include <cmath>
#include <stdexcept>
#include <string>

#include "ref/ref.h"

namespace unimoe::ref {
namespace {

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

}  // namespace

double activate(Activation act, double g, double u, double alpha, double limit) {
  switch (act) {
    case Activation::SwiGLU:
      return g * sigmoid(g) * u;
    case Activation::GeGLU:
      // The exact (erf) gelu, not the tanh approximation; 1 + erf(x) is
      // written erfc(-x) so it keeps its relative accuracy for very negative g.
      return 0.5 * g * std::erfc(-g / std::sqrt(2.0)) * u;
    case Activation::ReLU2: {
      const double r = g < 0 ? 0.0 : g;
      return r * r;
    }
    case Activation::SwiGLUOai: {
      // The gate is clamped from above only; the up value on both sides.
      const double gc = limit < g ? limit : g;
      const double uc = u < -limit ? -limit : (limit < u ? limit : u);
      return gc * sigmoid(alpha * gc) * (uc + 1.0);
    }
  }
  throw std::invalid_argument("activate: unknown activation " +
                              std::to_string(static_cast<int>(act)));
}

}  // namespace unimoe::ref
