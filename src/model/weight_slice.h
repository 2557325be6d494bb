// One checkpoint tensor read as a WeightSpec asks: whole, or the rows / columns of its slice, with
// its FP8 block scales sliced alike. Row slices of a tensor are views into the mapping (no copy);
// column slices are copied row by row (only the slice's bytes are read). An FP8 slice whose bounds
// are not multiples of the 128-wide scale blocks cannot keep block scales: it is dequantized to
// F32 (the published models' splits at TP 2..8 are all block-aligned; the tiny test models' are
// not).
#pragma once

#include <vector>

#include "core/tensor.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace osprey {

struct WeightRead {
  Tensor value;      // local_shape, in the checkpoint's dtype (or F32, see above)
  Tensor scale_inv;  // the value's block scales when it stays F8_E4M3, else empty
  size_t bytes = 0;  // checkpoint bytes this read touched
};

// Fails (osprey::Error) naming the tensor and file for a wrong shape, an FP8 tensor where the
// spec is unquantized, or a missing / non-F32 scale. Copies go into `owned`.
WeightRead read_weight(const Checkpoint& ckpt, const WeightSpec& spec, std::vector<Buffer>& owned);

// Prints "<label>: k/n safetensors shards, X GB in S s (Y GB/s)" to stderr, at most every
// kProgressIntervalS and once at the end.
class LoadProgress {
 public:
  LoadProgress(std::string label, int n_files);
  void add(int file_index, size_t bytes);
  void done();

 private:
  void print(bool final);
  std::string label_;
  int n_files_, files_done_ = 0, last_file_ = -1;
  size_t bytes_ = 0;
  double start_, last_print_;
};

// specs ordered as the checkpoint stores them (file, then offset): sequential reads.
std::vector<WeightSpec> in_checkpoint_order(const Checkpoint& ckpt, std::vector<WeightSpec> specs);

}  // namespace osprey
