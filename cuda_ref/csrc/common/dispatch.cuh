// Compile-time head-dim dispatch: one launcher body instantiated for D = 64 and 128 instead of copies.
#pragma once

#include <stdexcept>
#include <string>

// Runs the lambda-like body with `CONST_NAME` a constexpr int equal to `d`; other head dims throw
// std::invalid_argument (the Python layer rejects them first with NotImplementedError).
#define CUDA_REF_SWITCH_HEAD_DIM(d, CONST_NAME, ...)                                                   \
  [&] {                                                                                                \
    if ((d) == 64) {                                                                                   \
      constexpr int CONST_NAME = 64;                                                                   \
      return __VA_ARGS__();                                                                            \
    } else if ((d) == 128) {                                                                           \
      constexpr int CONST_NAME = 128;                                                                  \
      return __VA_ARGS__();                                                                            \
    } else {                                                                                           \
      throw std::invalid_argument("cuda_ref: head dim " + std::to_string(d) + " not supported (64, 128)"); \
    }                                                                                                  \
  }()
