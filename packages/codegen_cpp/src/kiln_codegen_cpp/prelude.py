"""The C++ text every translation unit starts with: types, conversions and scalar helpers.

Kernels are plain scalar C++ over ``float``/``double``/fixed-width integers; the compiler
vectorizes the innermost loop (``#pragma omp simd``) and calls glibc's vector math library
(libmvec) for ``exp``, ``log``, ``tanh``... because the math functions are re-declared below
with ``#pragma omp declare simd`` (glibc only does that itself under ``-ffast-math``, which would
also break NaN semantics). See Note [Why scalar C++ and omp simd] in ``kernel.py``.

The half types are stored as 16-bit integers and computed in ``float``: ``bfloat16`` converts
with round-to-nearest-even bit arithmetic, ``float16`` through GCC's ``_Float16`` (F16C
instructions under ``-march=native``). Helpers follow the conventions of loopir's interpreter:
``mod``/``fmod`` truncate, ``remainder``/``floordiv`` floor, ``maximum``/``minimum`` propagate NaN,
``round`` is half-to-even.
"""

from __future__ import annotations

# math functions libmvec (glibc 2.22+; the float ones used here since 2.35) has AVX2 variants of
VECTOR_MATH_1 = (
    "acos", "acosh", "asin", "asinh", "atan", "atanh", "cbrt", "cos", "cosh", "erf", "erfc",
    "exp", "exp10", "exp2", "expm1", "log", "log10", "log1p", "log2", "sin", "sinh", "tan", "tanh",
)  # fmt: skip
VECTOR_MATH_2 = ("atan2", "hypot", "pow")


def _simd_declarations() -> str:
    lines = ['extern "C" {']
    for name in VECTOR_MATH_1:
        for suffix, ctype in (("", "double"), ("f", "float")):
            lines.append("#pragma omp declare simd notinbranch")
            lines.append(f"{ctype} {name}{suffix}({ctype}) noexcept;")
    for name in VECTOR_MATH_2:
        for suffix, ctype in (("", "double"), ("f", "float")):
            lines.append("#pragma omp declare simd notinbranch")
            lines.append(f"{ctype} {name}{suffix}({ctype}, {ctype}) noexcept;")
    lines.append("}")
    return "\n".join(lines)


PRELUDE = (
    r"""// kiln codegen_cpp prelude
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <algorithm>
#include <omp.h>
#if defined(__GLIBC__) && defined(__x86_64__) && defined(KILN_LIBMVEC)
"""
    + _simd_declarations()
    + r"""
#endif

extern "C" { int64_t kiln_err_value = 0; }

namespace kiln {

// Note [Parallel plan] (parallel.py): the length of the chunks a pointwise kernel's innermost
// loop of `len` is cut into, for a team of `team` threads over `outer` outer iterations: about
// four chunks per thread, at least `min_chunk` long, a multiple of 16
static inline int64_t chunk_len(int64_t len, int64_t outer, int64_t team, int64_t min_chunk) {
  const int64_t want = (4 * team + outer - 1) / outer;
  int64_t c = (len + want - 1) / want;
  c = std::max<int64_t>(c, min_chunk);
  c = (c + 15) / 16 * 16;
  return std::min<int64_t>(c, len);
}

static inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}
static inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
static inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }
static inline float fp16_to_float(uint16_t v) {
  _Float16 h;
  std::memcpy(&h, &v, 2);
  return static_cast<float>(h);
}
static inline uint16_t float_to_fp16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t out;
  std::memcpy(&out, &h, 2);
  return out;
}
static inline float round_fp16(float f) { return fp16_to_float(float_to_fp16(f)); }

// nextafter in a 16-bit type's own steps (a float step would round back to the same value)
template <float (*To)(uint16_t), uint16_t (*From)(float)> static inline float nextafter16(float a, float b) {
  if (a != a || b != b) return a + b;
  if (a == b) return b;
  uint16_t h = From(a);
  if (a == 0.0f) h = b > 0.0f ? 0x0001 : 0x8001;
  else if ((a < b) == (a > 0.0f)) h += 1;
  else h -= 1;
  return To(h);
}
static inline float nextafter_bf16(float a, float b) { return nextafter16<bf16_to_float, float_to_bf16>(a, b); }
static inline float nextafter_fp16(float a, float b) { return nextafter16<fp16_to_float, float_to_fp16>(a, b); }

// Note [Maximum and minimum as two selects]: NaN in either operand wins and of equal values
// (-0.0 and 0.0) the second is kept, as eager's vectorized CPU kernels do (its scalar tail keeps
// the first: eager's own sign of a zero tie depends on the position). Spelled as one select
// on an or'ed condition, GCC 12 turns `a > b || a != a` into a branch on the data in scalar
// loops (mispredicted at every new maximum) and left some loops scalar; as two selects, the
// ordered compare first, it is a maxps/minps and a blend on an unordered compare (the max-pool
// finding, Note [Max pooling values without their indices] in kiln_loopir). The same for the
// reductions' combines below. CppOptions.select_minmax (off: -DKILN_MINMAX_OR, the old form).
#if defined(KILN_MINMAX_OR)
template <typename T> static inline T maximum(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> static inline T minimum(T a, T b) { return (a < b || a != a) ? a : b; }
#else
template <typename T> static inline T maximum(T a, T b) {
  const T bigger = a > b ? a : b;
  return a != a ? a : bigger;
}
template <typename T> static inline T minimum(T a, T b) {
  const T smaller = a < b ? a : b;
  return a != a ? a : smaller;
}
#endif
template <typename T> static inline T relu(T a) { return a < T(0) ? T(0) : a; }
// relu of a float in integer bits: it clears the value when it is below zero (not -0.0, not a
// NaN). Written as a select, GCC 12 pushes a later isnan() through it into a select of booleans
// that its vectorizer rejects, leaving ReLU+max-pool kernels scalar and ~15x slower.
template <> inline float relu<float>(float a) {
  int32_t u; std::memcpy(&u, &a, 4);
  const int32_t below = -static_cast<int32_t>(u > INT32_MIN && u <= static_cast<int32_t>(0xff800000u));
  u &= ~below;
  float out; std::memcpy(&out, &u, 4); return out;
}
template <> inline double relu<double>(double a) {
  int64_t u; std::memcpy(&u, &a, 8);
  const int64_t below = -static_cast<int64_t>(u > INT64_MIN && u <= static_cast<int64_t>(0xfff0000000000000ull));
  u &= ~below;
  double out; std::memcpy(&out, &u, 8); return out;
}
template <typename T> static inline T sign(T a) { return a > T(0) ? T(1) : (a < T(0) ? T(-1) : T(0)); }
// Note [Logarithms off libmvec's slow path]: libmvec's vector logf/log (and log2, log10) send a
// vector holding any lane that is not a positive finite number (zero, negative, inf, NaN) to a
// scalar loop over its lanes: a kernel of ``log(x)`` over 64K float32 elements took 17 us at one
// thread here, 170 us with every second one zero. Zeros reach a log where its lanes are masked away
// later: T5's relative-position buckets take the log of a triangle of zeros (``where`` keeps the
// exact buckets there), so the kernel cost ~10x on those rows, and the rows of zeros, contiguous,
// all landed on the first threads (1.16x from 1 to 16 threads on the 16-core host). So such lanes
// take 1 into the call and their result (-inf for zeros, inf, NaN) is chosen after it: 26 us
// whatever the values, at the price of 17 -> 25 us on positive ones (the mask, the special values
// and the blends, ~0.12 ns an element; a log in a real kernel is rarely alone: T5's bucket kernels
// 66 -> 18 and 36 -> 20 us at one thread, bench/kernel_time.py --models suite.t5 --inference
// --ab-cpp guarded_log=0). The argument is picked by masking its bits, not by a select: GCC moves a
// select of a constant out of the call (``log(c ? 1 : a)`` -> ``c ? 0 : log(a)``), which calls the
// vector log on the zeros again. Subnormal inputs still take the slow path (their log is not that
// of 1). In a loop whose values come from the loop indices alone (T5's), GCC's partial redundancy
// elimination then moved the call of the next iteration into the loop's latch in the serial copy
// (Note [Serial path] in kernel.py), which then did not vectorize ("latch block not empty", 92 us
// against 58): a kernel that calls these and reads no buffer is compiled without that pass
// (``#pragma GCC optimize("no-tree-pre")`` around it; loop-invariant motion is another pass). Not
// every kernel that calls them: a softmax (reads, guarded exp) ran 147 us without the pragma,
// 160 with it, and vectorized either way.
// CppOptions.guarded_log (off: -DKILN_PLAIN_LOG, the library's call, no pragma).
template <typename T> struct same_size_int;
template <> struct same_size_int<float> { using type = int32_t; };
template <> struct same_size_int<double> { using type = int64_t; };
#if defined(KILN_PLAIN_LOG)
template <typename T> static inline T log(T a) { return std::log(a); }
template <typename T> static inline T log2(T a) { return std::log2(a); }
template <typename T> static inline T log10(T a) { return std::log10(a); }
#else
template <typename T, typename F> static inline T guarded_log(T a, F f) {
  using I = typename same_size_int<T>::type;
  using U = typename std::make_unsigned<I>::type;
  constexpr T inf = std::numeric_limits<T>::infinity();
  const T one = T(1);
  const T big = std::numeric_limits<T>::max();
  I bits, one_bits, big_bits;
  std::memcpy(&bits, &a, sizeof(T));
  std::memcpy(&one_bits, &one, sizeof(T));
  std::memcpy(&big_bits, &big, sizeof(T));
  // the positive finite numbers (subnormals too) are the bit patterns 1 .. those of the largest
  const I keep = -static_cast<I>(static_cast<U>(bits) - U(1) < static_cast<U>(big_bits));
  const I arg_bits = (bits & keep) | (one_bits & ~keep);
  T arg;
  std::memcpy(&arg, &arg_bits, sizeof(T));
  const T r = f(arg);
  // the log of a zero, inf, a negative number or NaN (sqrt: inf for inf, NaN for the others)
  const T special = a == T(0) ? -inf : std::sqrt(a);
  return keep ? r : special;
}
// float and double guarded; any other type (not expected: halves compute in float) as the library
#define KILN_GUARDED(name)                                                            \
  template <typename T> static inline auto name(T a) {                                \
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)               \
      return guarded_log(a, [](T v) { return std::name(v); });                         \
    else                                                                               \
      return std::name(a);                                                             \
  }
KILN_GUARDED(log)
KILN_GUARDED(log2)
KILN_GUARDED(log10)
#undef KILN_GUARDED
#endif
// Note [Exponentials off libmvec's slow path]: libmvec's vector expf/exp take the same scalar
// path (Note [Logarithms off libmvec's slow path]) for a vector holding a lane whose result
// underflows or overflows (below about -87.3 for float32, above 88.7) or NaN: a softmax's masked
// scores, -inf or finfo.min, minus the row's max. A causal [4, 256, 256] float32 softmax took
// 136 us unmasked at one thread here, 493 us masked with -inf, 683 with finfo.min (eager 136 for
// all three). So a lane below ``lo`` (where the result rounds to zero) or above ``hi`` (inf), or
// NaN, gives 0 to the call, its bits masked, and takes its result after it: 147-150 us for all
// three, the guard's ~10% on the unmasked one the price (eager's own vector exp needs none).
// Lanes between those bounds and the library's own still take its scalar path, exact (a
// softmax's scores rarely differ by 87-104 without a mask). CppOptions.guarded_exp (off:
// -DKILN_PLAIN_EXP, the library's call). Not in ``sigmoid``: its argument rarely leaves the
// range, and SiLU is in every LLaMA-like MLP.
#if defined(KILN_PLAIN_EXP)
template <typename T> static inline T exp(T a) { return std::exp(a); }
#else
template <typename T> static inline auto exp(T a) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    using I = typename same_size_int<T>::type;
    constexpr T lo = sizeof(T) == 4 ? T(-104) : T(-746);  // exp(lo) rounds to 0
    constexpr T hi = sizeof(T) == 4 ? T(89) : T(710);  // exp(hi) overflows
    const I keep = -static_cast<I>(a >= lo && a <= hi);
    I bits;
    std::memcpy(&bits, &a, sizeof(T));
    const I arg_bits = bits & keep;  // 0.0 where not kept
    T arg;
    std::memcpy(&arg, &arg_bits, sizeof(T));
    const T r = std::exp(arg);
    const T special = a < T(0) ? T(0) : a * std::numeric_limits<T>::infinity();  // 0, inf, NaN
    return keep ? r : special;
  } else {
    return std::exp(a);
  }
}
#endif
template <typename T> static inline T sigmoid(T a) { return T(1) / (T(1) + std::exp(-a)); }
template <typename T> static inline T rsqrt(T a) { return T(1) / std::sqrt(a); }
template <typename T> static inline T frac(T a) { return a - std::trunc(a); }
// Note [Integer arithmetic wraps]: eager's integer add, sub, mul, neg and abs wrap around in
// two's complement (int32 max + 1 is int32 min, abs(int32 min) is int32 min); in C++ a signed
// overflow is undefined, and GCC uses that: it folded `(x + 1) > x` to true, `-x < 0` to
// `x > 0` and `abs(x) < 0` to false, wrong answers at the dtype's extremes. So the arithmetic of
// integer values is done in an unsigned type (at least 32 bits wide, so that a 16-bit product
// is not promoted to a signed int that overflows), where wrapping is defined, and converted back
// (GCC converts modulo 2^N). Index arithmetic (int64 loop variables, offsets) keeps the plain
// operators: it never overflows, and the vectorizer relies on that.
template <typename T>
using wrap_t = std::conditional_t<(sizeof(T) < sizeof(uint32_t)), uint32_t, std::make_unsigned_t<T>>;
template <typename T> static inline T wrap_add(T a, T b) {
  return static_cast<T>(static_cast<wrap_t<T>>(a) + static_cast<wrap_t<T>>(b));
}
template <typename T> static inline T wrap_sub(T a, T b) {
  return static_cast<T>(static_cast<wrap_t<T>>(a) - static_cast<wrap_t<T>>(b));
}
template <typename T> static inline T wrap_mul(T a, T b) {
  return static_cast<T>(static_cast<wrap_t<T>>(a) * static_cast<wrap_t<T>>(b));
}
template <typename T> static inline T wrap_neg(T a) { return static_cast<T>(wrap_t<T>(0) - static_cast<wrap_t<T>>(a)); }
template <typename T> static inline T iabs(T a) { return a < T(0) ? wrap_neg(a) : a; }
// the sign bit read as bits: GCC 12 hits an internal compiler error vectorizing std::signbit of
// a widened bfloat16 (seen in the OpInfo sweep)
static inline bool signbit(float a) { uint32_t b; std::memcpy(&b, &a, 4); return (b >> 31) != 0; }
static inline bool signbit(double a) { uint64_t b; std::memcpy(&b, &a, 8); return (b >> 63) != 0; }

template <typename T> static inline T int_floordiv(T a, T b) {
  if (b == 0) return T(0);
  T q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
  return q;
}
template <typename T> static inline T int_truncdiv(T a, T b) { return b == 0 ? T(0) : T(a / b); }
template <typename T> static inline T int_mod(T a, T b) { return b == 0 ? T(0) : T(a % b); }
template <typename T> static inline T int_remainder(T a, T b) {
  if (b == 0) return T(0);
  T r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
template <typename T> static inline T float_remainder(T a, T b) {
  T r = std::fmod(a, b);
  if (r != T(0) && ((r < T(0)) != (b < T(0)))) r += b;
  return r;
}
template <typename T> static inline T float_floordiv(T a, T b) {
  if (b == T(0)) return a / b;
  T m = std::fmod(a, b);
  T d = (a - m) / b;
  if (m != T(0) && ((b < T(0)) != (m < T(0)))) d -= T(1);
  T f = std::floor(d);
  if (d - f > T(0.5)) f += T(1);
  return (d == T(0)) ? std::copysign(T(0), a / b) : f;
}
template <typename T> static inline T int_pow(T a, T b) {
  if (b < 0) return (a == 1) ? T(1) : (a == -1 ? ((b % 2) ? T(-1) : T(1)) : T(0));
  T out = 1;
  while (b) { if (b & 1) out = wrap_mul(out, a); a = wrap_mul(a, a); b >>= 1; }
  return out;
}
template <typename T, typename S> static inline T shl(T a, S b) {
  return (b < 0 || b >= S(sizeof(T) * 8)) ? T(0) : static_cast<T>(static_cast<wrap_t<T>>(a) << b);
}
template <typename T, typename S> static inline T shr(T a, S b) {
  return (b < 0 || b >= S(sizeof(T) * 8)) ? T(a < 0 ? -1 : 0) : T(a >> b);
}
template <typename T> static inline T erfinv(T y) {
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  if (y <= T(-1)) return y == T(-1) ? -inf : nan;
  if (y >= T(1)) return y == T(1) ? inf : nan;
  double x = y;
  double w = -std::log((1.0 - x) * (1.0 + x));
  double p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08; p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w;
    p = -4.39150654e-06 + p * w; p = 0.00021858087 + p * w; p = -0.00125372503 + p * w;
    p = -0.00417768164 + p * w; p = 0.246640727 + p * w; p = 1.50140941 + p * w;
  } else {
    w = std::sqrt(w) - 3.0;
    p = -0.000200214257; p = 0.000100950558 + p * w; p = 0.00134934322 + p * w;
    p = -0.00367342844 + p * w; p = 0.00573950773 + p * w; p = -0.0076224613 + p * w;
    p = 0.00943887047 + p * w; p = 1.00167406 + p * w; p = 2.83297682 + p * w;
  }
  double r = p * x;
  for (int i = 0; i < 2; ++i) {
    double err = std::erf(r) - x;
    r -= err / (1.1283791670955126 * std::exp(-r * r));
  }
  return T(r);
}

// reduction combines; NaN wins for max/min (as eager), the first index wins ties for arg*.
// (Note [Maximum and minimum as two selects]: the same as maximum(v, acc))
template <typename T> static inline T red_max(T acc, T v) { return maximum(v, acc); }
template <typename T> static inline T red_min(T acc, T v) { return minimum(v, acc); }
template <typename T> static inline void arg_max(T& acc, int64_t& idx, T v, int64_t i) {
  if (acc != acc) return;
  if (v > acc || v != v) { acc = v; idx = i; }
}
template <typename T> static inline void arg_min(T& acc, int64_t& idx, T v, int64_t i) {
  if (acc != acc) return;
  if (v < acc || v != v) { acc = v; idx = i; }
}
// merging two partial arg results: the better value; on a tie (or both NaN) the lower index
template <typename T> static inline void arg_max_merge(T& acc, int64_t& idx, T v, int64_t i) {
  bool vn = v != v, an = acc != acc;
  if (an && vn) { if (i < idx) idx = i; return; }
  if (an) return;
  if (vn || v > acc || (v == acc && i < idx)) { acc = v; idx = i; }
}
template <typename T> static inline void arg_min_merge(T& acc, int64_t& idx, T v, int64_t i) {
  bool vn = v != v, an = acc != acc;
  if (an && vn) { if (i < idx) idx = i; return; }
  if (an) return;
  if (vn || v < acc || (v == acc && i < idx)) { acc = v; idx = i; }
}
// inv = 1 / (w + 1), computed by the caller (Note [Welford reciprocal] in kernel.py)
template <typename T, typename U> static inline void welford_add(T& mean, T& m2, T& w, T v, U inv) {
  w += T(1);
  T d = v - mean;
  // an infinity on either side: the sum's mean (as welford_merge's), not inf - inf
  mean = d - d == T(0) ? mean + d * static_cast<T>(inv) : mean + v;
  m2 += d * (v - mean);
}
template <typename T> static inline void welford_merge(T& mean, T& m2, T& w, T mb, T m2b, T wb) {
  if (wb == T(0)) return;
  if (w == T(0)) { mean = mb; m2 = m2b; w = wb; return; }
  T n = w + wb;
  T d = mb - mean;
  T f = wb / n;
  // an infinite mean on either side: the sum's answer (inf + finite = inf, inf - inf = NaN), not
  // inf - inf from d (a mean of finite values and +inf is +inf, as mean.dim's)
  mean = d - d == T(0) ? mean + d * f : mean + mb;
  m2 += m2b + d * d * w * f;
  w = n;
}
// Note [Shifted Welford blocks] (kernel.py): a lane's float block of one Welford statistic is
// its first finite element k and the sums of v - k and (v - k)^2 over n elements
template <typename S1, typename S>
static inline void shifted_add(float& k, S1& s1, S& s2, float& n, float v) {
  k = (n == 0.0f && v - v == 0.0f) ? v : k;
  const float d = v - k;
  s1 += static_cast<S1>(d);
  s2 += static_cast<S>(d) * static_cast<S>(d);
  n += 1.0f;
}
// Note [Peeled shifted blocks] (kernel.py): a block's first element (k: it when finite, else 0,
// as shifted_add chooses it) and its later ones (k fixed); n is set from the block's length
template <typename S1, typename S>
static inline void shifted_first(float& k, S1& s1, S& s2, float&, float v) {
  k = v - v == 0.0f ? v : 0.0f;
  const float d = v - k;
  s1 += static_cast<S1>(d);
  s2 += static_cast<S>(d) * static_cast<S>(d);
}
template <typename S1, typename S>
static inline void shifted_next(const float& k, S1& s1, S& s2, float&, float v) {
  const float d = v - k;
  s1 += static_cast<S1>(d);
  s2 += static_cast<S>(d) * static_cast<S>(d);
}
// merges the block (mean k + s1 / n, m2 s2 - s1^2 / n, weight n) into Welford lanes, in T;
// clears the block
template <typename T, typename S1, typename S>
static inline void shifted_fold(T& mean, T& m2, T& w, float& k, S1& s1, S& s2, float& n) {
  if (n != 0.0f) {
    const T nb = static_cast<T>(n), a = static_cast<T>(s1);
    const T q = static_cast<T>(s2) - a * a / nb;
    welford_merge(mean, m2, w, static_cast<T>(k) + a / nb, q < T(0) ? T(0) : q, nb);
  }
  k = 0.0f;
  s1 = S1(0);
  s2 = S(0);
  n = 0.0f;
}

}  // namespace kiln
"""
)


MODULE_TOKEN = "KILN_MODULE_NAME"
# the prelude's one definition with external linkage (Note [The parts share one prelude] in units.py)
ERR_VALUE_DEFINITION = 'extern "C" { int64_t kiln_err_value = 0; }'
assert ERR_VALUE_DEFINITION in PRELUDE


def extension_module(kernels: list[tuple[str, list[str], bool]]) -> str:
    """The CPython extension that exposes each kernel ``(name, param types, release GIL)``.

    Note [Calling kernels]: each kernel gets a ``METH_FASTCALL`` function that reads its pointer
    arguments with ``PyLong_AsVoidPtr``. Measured against ``ctypes`` (argtypes set, same
    arguments) on this project's CPU machine: ~0.4 us per call against ~3.2 us, so the wrapper
    calls kernels through the extension. Large kernels release the GIL while they run.
    """
    out: list[str] = []
    table: list[str] = []
    for name, types, release in kernels:
        n = len(types)
        out.append(f"static PyObject* py_{name}(PyObject*, PyObject* const* args, Py_ssize_t nargs) {{")
        message = f'"{name}: wrong arguments"'
        out.append(f"  if (nargs != {n + 1}) {{ PyErr_SetString(PyExc_TypeError, {message}); return NULL; }}")
        for i, t in enumerate(types):
            if t == "int64_t":  # a size (Note [Symbolic sizes in C++ kernels])
                out.append(f"  int64_t a{i} = PyLong_AsLongLong(args[{i}]);")
            else:
                out.append(f"  void* a{i} = PyLong_AsVoidPtr(args[{i}]);")
        out.append(f"  int64_t nt = PyLong_AsLongLong(args[{n}]);")
        out.append("  if (PyErr_Occurred()) return NULL;")
        call_args = ", ".join(
            [*(f"a{i}" if t == "int64_t" else f"static_cast<{t}>(a{i})" for i, t in enumerate(types)), "nt"]
        )
        out.append("  int64_t err;")
        if release:
            out.append("  Py_BEGIN_ALLOW_THREADS")
        out.append(f"  err = {name}({call_args});")
        if release:
            out.append("  Py_END_ALLOW_THREADS")
        out.append("  return PyLong_FromLongLong(err);")
        out.append("}")
        table.append(f'  {{"{name}", (PyCFunction)(void (*)(void))py_{name}, METH_FASTCALL, NULL}},')
    out.append(
        "static PyObject* py_err_value(PyObject*, PyObject*) { return PyLong_FromLongLong(kiln_err_value); }"
    )
    table.append('  {"err_value", (PyCFunction)py_err_value, METH_NOARGS, NULL},')
    out.append("static PyMethodDef kiln_methods[] = {")
    out.extend(table)
    out.append("  {NULL, NULL, 0, NULL}};")
    out.append("static struct PyModuleDef kiln_module = {")
    out.append(f'  PyModuleDef_HEAD_INIT, "{MODULE_TOKEN}", NULL, -1, kiln_methods}};')
    out.append(
        f'extern "C" PyMODINIT_FUNC PyInit_{MODULE_TOKEN}(void) {{ return PyModule_Create(&kiln_module); }}'
    )
    return "\n".join(out)
