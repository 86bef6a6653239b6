#include "plan/tactics.h"

namespace unimoe {

std::string GemmTactic::to_string() const {
  return "m" + std::to_string(tile_m) + "n" + std::to_string(tile_n);
}

}  // namespace unimoe
