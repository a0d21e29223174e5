// The strided float32 layouts the benchmarks copy to row-major order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace dlasync::bench {

// Strided layouts whose compact copy is `bytes` long, of float32.
struct layout {
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::int64_t first = 0;   // elements from the buffer start to the first element
  std::int64_t buffer = 0;  // elements of backing buffer
};

inline layout make_layout(const std::string& kind, std::int64_t bytes) {
  const std::int64_t n = bytes / 4;
  if (kind == "rows") {  // every other row of runs of 256 floats: 1 KiB runs
    const std::int64_t cols = 256;
    const std::int64_t rows = std::max<std::int64_t>(1, n / cols);
    return {{rows, cols}, {2 * cols, 1}, 0, 2 * rows * cols};
  }
  if (kind == "transpose2d") {
    std::int64_t side = 1;
    while ((side * 2) * (side * 2) <= n) side *= 2;
    return {{side, side}, {1, side}, 0, side * side};
  }
  if (kind == "transpose3d") {  // (a, b, c) read as (a, c, b)
    std::int64_t side = 1;
    while ((side * 2) * (side * 2) * 8 <= n) side *= 2;
    return {{8, side, side}, {side * side, 1, side}, 0, 8 * side * side};
  }
  if (kind == "broadcast") {  // one row of 256 repeated
    return {{std::max<std::int64_t>(1, n / 256), 256}, {0, 1}, 0, 256};
  }
  // reversed rows
  const std::int64_t rows = std::max<std::int64_t>(1, n / 256);
  return {{rows, 256}, {-256, 1}, (rows - 1) * 256, rows * 256};
}

inline std::int64_t copy_bytes(const layout& l) {
  std::int64_t count = 4;
  for (std::int64_t e : l.shape) count *= e;
  return count;
}

}  // namespace dlasync::bench
