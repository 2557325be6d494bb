#include "ops/sample.h"

#include <limits>

#include "core/error.h"

namespace osprey {

SampleShapes check_sample_shapes(Tensor tokens, Tensor logprobs, Tensor top_ids, Tensor logits,
                                 const SampleMeta& m) {
  OSPREY_CHECK(logits.dim() == 2 && logits.dtype == DType::F32, "sample: logits ",
               shape_str(logits.shape), " must be [n_rows, vocab] F32");
  SampleShapes s;
  s.n_rows = logits.size(0);
  s.vocab = logits.size(1);
  OSPREY_CHECK(m.n_rows == s.n_rows && tokens.numel() == s.n_rows && tokens.dtype == DType::I32,
               "sample: ", m.n_rows, " rows, tokens ", shape_str(tokens.shape), " for logits ",
               shape_str(logits.shape));
  OSPREY_CHECK(s.vocab > 0 && s.vocab <= std::numeric_limits<int32_t>::max(), "vocab ", s.vocab);
  OSPREY_CHECK(m.rows.nbytes() == size_t(s.n_rows) * sizeof(SampleRowParams), "sample: rows of ",
               m.rows.nbytes(), " bytes for ", s.n_rows, " rows");
  s.n_lp = logprobs.dim() == 2 ? logprobs.size(0) : 0;
  OSPREY_CHECK(
      s.n_lp == 0 ||
          (logprobs.size(1) == 1 + kMaxTopLogprobs && top_ids.numel() == s.n_lp * kMaxTopLogprobs),
      "sample: logprobs ", shape_str(logprobs.shape), " top_ids ", shape_str(top_ids.shape));
  s.n_slots = m.output_counts.dim() == 2 ? m.output_counts.size(0) : 0;
  OSPREY_CHECK(s.n_slots == 0 || (m.output_counts.size(1) == s.vocab &&
                                  m.prompt_mask.numel() == s.n_slots * sample_mask_words(s.vocab)),
               "sample: penalty state ", shape_str(m.output_counts.shape), " / ",
               shape_str(m.prompt_mask.shape), " for vocab ", s.vocab);
  return s;
}

}  // namespace osprey
