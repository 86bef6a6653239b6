// The unimoe::Error a call throws, for tests that check its field and text.
#pragma once

#include <gtest/gtest.h>

#include "unimoe/unimoe.h"

namespace unimoe::test {

// The Error thrown by `f`, or a test failure (and an empty Error) when it
// throws none.
template <class F>
Error error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no Error thrown";
  return Error("none", "");
}

}  // namespace unimoe::test
