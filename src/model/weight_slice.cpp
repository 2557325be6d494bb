#include "model/weight_slice.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace osprey {

Shape WeightSpec::local_shape() const {
  Shape s = shape;
  if (slice.dim >= 0) s[size_t(slice.dim)] = slice.end - slice.begin;
  return s;
}

namespace {

// Columns [c0, c1) of every row of a 2-D host tensor, copied (same dtype).
Tensor copy_columns(Tensor t, int64_t c0, int64_t c1, std::vector<Buffer>& owned) {
  const int64_t R = t.size(0), C = t.size(1), w = c1 - c0;
  const size_t es = dtype_size(t.dtype);
  Buffer b(t.dtype, {R, w});
  for (int64_t r = 0; r < R; ++r)
    std::memcpy(static_cast<char*>(b.view().data) + size_t(r * w) * es,
                static_cast<const char*>(t.data) + size_t(r * C + c0) * es, size_t(w) * es);
  owned.push_back(std::move(b));
  return owned.back().view();
}

Tensor apply(Tensor t, const TensorSlice& s, std::vector<Buffer>& owned) {
  if (s.dim < 0) return t;
  if (s.dim == 0) return t.rows(s.begin, s.end);
  return copy_columns(t, s.begin, s.end, owned);
}

}  // namespace

WeightRead read_weight(const Checkpoint& ck, const WeightSpec& spec, std::vector<Buffer>& owned) {
  const Tensor t = ck.get(spec.name, spec.shape);
  const std::string& file = ck.file_of(spec.name);
  const Shape local = spec.local_shape();
  const size_t local_bytes = size_t(shape_numel(local)) * dtype_size(t.dtype);
  if (t.dtype != DType::F8_E4M3) return {apply(t, spec.slice, owned), {}, local_bytes};
  if (!spec.fp8)
    fail(file, ": tensor '", spec.name, "' is F8_E4M3, but osprey expects it unquantized");
  const std::string sname = spec.name + "_scale_inv";
  if (!ck.contains(sname)) fail(file, ": FP8 tensor '", spec.name, "' has no '", sname, "'");
  const Shape sshape = {(spec.shape[0] + kFp8BlockSize - 1) / kFp8BlockSize,
                        (spec.shape[1] + kFp8BlockSize - 1) / kFp8BlockSize};
  const Tensor s = ck.get(sname, sshape);
  if (s.dtype != DType::F32)
    fail(ck.file_of(sname), ": tensor '", sname, "' must be F32, got ", dtype_name(s.dtype));
  const TensorSlice& sl = spec.slice;
  const int64_t full = sl.dim < 0 ? 0 : spec.shape[size_t(sl.dim)];
  const bool aligned = sl.dim < 0 || (sl.begin % kFp8BlockSize == 0 &&
                                      (sl.end % kFp8BlockSize == 0 || sl.end == full));
  if (aligned) {
    TensorSlice ss = sl;
    if (sl.dim >= 0) {
      ss.begin = sl.begin / kFp8BlockSize;
      ss.end = (sl.end + kFp8BlockSize - 1) / kFp8BlockSize;
    }
    const Tensor sv = apply(s, ss, owned);
    return {apply(t, sl, owned), sv, local_bytes + sv.nbytes()};
  }
  // Unaligned: the slice's values dequantized with the scale of each element's block.
  Buffer f(DType::F32, local);
  const int64_t R = local[0], C = local[1], cols = spec.shape[1];
  const int64_t r0 = sl.dim == 0 ? sl.begin : 0, c0 = sl.dim == 1 ? sl.begin : 0;
  const uint8_t* w8 = static_cast<const uint8_t*>(t.data);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const int64_t gr = r0 + r, gc = c0 + c;
      f.f32()[r * C + c] = e4m3_to_f32(w8[gr * cols + gc]) *
                           s.f32()[(gr / kFp8BlockSize) * sshape[1] + gc / kFp8BlockSize];
    }
  owned.push_back(std::move(f));
  return {owned.back().view(), {}, local_bytes};
}

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
// How often a long load updates its progress line (seconds).
constexpr double kProgressIntervalS = 2.0;
}  // namespace

LoadProgress::LoadProgress(std::string label, int n_files)
    : label_(std::move(label)), n_files_(n_files), start_(now_s()), last_print_(start_) {}

void LoadProgress::add(int file_index, size_t bytes) {
  if (file_index != last_file_) {
    if (last_file_ >= 0) ++files_done_;
    last_file_ = file_index;
  }
  bytes_ += bytes;
  if (now_s() - last_print_ >= kProgressIntervalS) print(false);
}

void LoadProgress::done() {
  if (last_file_ >= 0) ++files_done_, last_file_ = -1;
  print(true);
}

void LoadProgress::print(bool final) {
  last_print_ = now_s();
  const double s = std::max(last_print_ - start_, 1e-6), gb = double(bytes_) / 1e9;
  std::fprintf(stderr, "%s: %d/%d safetensors shards, %.3f GB in %.2f s (%.2f GB/s)%s\n",
               label_.c_str(), files_done_, n_files_, gb, s, gb / s, final ? "" : " ...");
}

std::vector<WeightSpec> in_checkpoint_order(const Checkpoint& ck, std::vector<WeightSpec> specs) {
  auto key = [&](const WeightSpec& w) {
    return ck.contains(w.name) ? std::make_pair(ck.file_index(w.name), ck.info(w.name).begin)
                               : std::make_pair(size_t(-1), size_t(0));
  };
  std::stable_sort(specs.begin(), specs.end(),
                   [&](const WeightSpec& a, const WeightSpec& b) { return key(a) < key(b); });
  return specs;
}

}  // namespace osprey
