// The gather kernels' division by extents (gather_math.hpp): magic numbers
// computed on the host, a multiply-high and a shift on the GPU. It must
// agree with / and % for every numerator below 2^63 (every index of a
// tensor) and every divisor an extent can be.
#include "transfer/src/kernels/gather_math.hpp"

#include <cstdint>
#include <random>
#include <vector>

#include "catch2/catch.hpp"

namespace dlasync::copy_kernels {
namespace {

constexpr std::uint64_t max_index = (std::uint64_t{1} << 63) - 1;

// Checks n / d for `n` and the numerators next to it.
void check_around(std::uint64_t n, std::uint64_t d, const fast_divisor& f) {
  for (const std::uint64_t delta : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{2}}) {
    for (const std::uint64_t m : {n - delta, n + delta}) {
      if (m > max_index) continue;
      const std::uint64_t q = fast_divide(m, f);
      if (q != m / d) {
        FAIL_CHECK(m << " / " << d << ": " << q << ", not " << m / d);
        return;
      }
    }
  }
}

// Divisors worth trying: small ones, powers of two and their neighbours,
// 2^32 +- 1, and the largest.
std::vector<std::uint64_t> edge_divisors() {
  std::vector<std::uint64_t> out;
  for (std::uint64_t d = 1; d <= 40; ++d) out.push_back(d);
  for (int k = 1; k < 63; ++k) {
    const std::uint64_t p = std::uint64_t{1} << k;
    out.insert(out.end(), {p - 1, p, p + 1});
  }
  out.insert(out.end(), {max_index, max_index - 1, (max_index >> 1) + 1, 1000000007u,
                         std::uint64_t{3} << 61, (std::uint64_t{1} << 40) + 12345});
  return out;
}

}  // namespace

TEST_CASE("fast division is exact for every small numerator and divisor", "[copy][gather]") {
  for (std::uint64_t d = 1; d <= 1200; ++d) {
    const fast_divisor f = make_fast_divisor(d);
    for (std::uint64_t n = 0; n < 5000; ++n) {
      if (fast_divide(n, f) != n / d) {
        FAIL(n << " / " << d << ": " << fast_divide(n, f));
      }
    }
  }
}

TEST_CASE("fast division is exact at the edges of divisors and numerators", "[copy][gather]") {
  std::mt19937_64 random(20260301);
  for (const std::uint64_t d : edge_divisors()) {
    INFO("divisor " << d);
    const fast_divisor f = make_fast_divisor(d);
    CHECK(f.shift <= 63);
    check_around(0, d, f);
    check_around(max_index, d, f);
    check_around(d, d, f);
    // Around multiples of d: the quotient's steps are where an inexact
    // multiplier would show.
    const std::uint64_t most = max_index / d;
    for (const std::uint64_t q : {std::uint64_t{1}, std::uint64_t{2}, most, most - 1, most / 2}) {
      if (q == 0 || q > most) continue;
      check_around(q * d, d, f);
    }
    for (int trial = 0; trial < 200; ++trial) {
      const std::uint64_t n = random() & max_index;
      check_around(n, d, f);
      const std::uint64_t q = std::uniform_int_distribution<std::uint64_t>(0, most)(random);
      check_around(q * d, d, f);
    }
  }
}

TEST_CASE("fast division is exact for random divisors up to 2^63", "[copy][gather]") {
  std::mt19937_64 random(7);
  for (int trial = 0; trial < 20000; ++trial) {
    // Divisors of every size: 2^40 and far beyond.
    const int bits = std::uniform_int_distribution<int>(1, 63)(random);
    const std::uint64_t d = (random() >> (64 - bits)) | 1u << (trial % 2);
    const fast_divisor f = make_fast_divisor(d);
    INFO("divisor " << d);
    const std::uint64_t n = random() & max_index;
    check_around(n, d, f);
    const std::uint64_t q = std::uniform_int_distribution<std::uint64_t>(0, max_index / d)(random);
    check_around(q * d, d, f);
    // A remainder, as the kernels take it.
    const std::uint64_t quotient = fast_divide(n, f);
    CHECK(n - quotient * d == n % d);
  }
}

TEST_CASE("an extent of 0 or 1 divides by 1", "[copy][gather]") {
  for (const std::uint64_t d : {std::uint64_t{0}, std::uint64_t{1}}) {
    const fast_divisor f = make_fast_divisor(d);
    for (const std::uint64_t n :
         {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{12345}, max_index - 1, max_index}) {
      CHECK(fast_divide(n, f) == n);
    }
  }
}

TEST_CASE("the portable multiply-high agrees with 128-bit products", "[copy][gather]") {
  std::mt19937_64 random(99);
  const std::uint64_t edges[] = {0,
                                 1,
                                 0xffffffffu,
                                 0x100000000u,
                                 ~std::uint64_t{0},
                                 ~std::uint64_t{0} - 1,
                                 std::uint64_t{1} << 63};
  std::vector<std::uint64_t> values(std::begin(edges), std::end(edges));
  for (int i = 0; i < 2000; ++i) values.push_back(random() >> (i % 64));
  __extension__ using u128 = unsigned __int128;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint64_t a = values[i];
    const std::uint64_t b = values[(i * 7 + 3) % values.size()];
    const auto want = static_cast<std::uint64_t>((static_cast<u128>(a) * b) >> 64);
    CHECK(mul_high_portable(a, b) == want);
    CHECK(mul_high(a, b) == want);
  }
}

}  // namespace dlasync::copy_kernels
