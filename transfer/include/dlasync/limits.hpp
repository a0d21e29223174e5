// dlasync/limits.hpp
//
// The bounds dlasync puts on what it imports. Plain C++17, so that the
// CUDA kernels (compiled by nvcc) size their parameters from the same
// numbers that validation enforces.
#pragma once

#include <cstddef>

namespace dlasync {

// The most dimensions an imported tensor may have (NumPy 2 allows 64 too).
inline constexpr int max_ndim = 64;

// The largest `import_options::min_alignment` a caller may ask for.
inline constexpr std::size_t max_alignment = std::size_t{1} << 20;

}  // namespace dlasync
