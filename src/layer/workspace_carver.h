// Hands out 256-byte aligned slices of one device allocation: a dry run
// (null base) sizes it, a second run over the allocation hands the slices
// out. Used by the layer's arena and by a backend's own buffers.
#pragma once

#include <cstddef>

namespace unimoe {

class WorkspaceCarver {
 public:
  static constexpr std::size_t kAlign = 256;

  explicit WorkspaceCarver(char* base) : base_(base) {}
  template <typename T>
  T* take(std::size_t count) {
    T* p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += align_up(count * sizeof(T));
    return p;
  }
  std::size_t used() const { return used_; }

 private:
  static std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

  char* base_;
  std::size_t used_ = 0;
};

}  // namespace unimoe
