#include "bench/decode_batch.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace osprey::bench {

DecodeBatch make_decode_batch(int n_seqs, int s_q, int ctx, int block, std::mt19937_64& rng) {
  OSPREY_CHECK(n_seqs > 0 && s_q > 0 && ctx >= s_q && block > 0,
               "make_decode_batch: bad shape (n_seqs ", n_seqs, ", s_q ", s_q, ", ctx ", ctx,
               ", block ", block, ")");
  DecodeBatch in;
  const int nb = (ctx + block - 1) / block;
  in.n_blocks = int64_t(nb) * n_seqs;
  in.n_tokens = int64_t(n_seqs) * s_q;
  in.qsl = Buffer(DType::I32, {n_seqs + 1});
  in.seq_lens = Buffer(DType::I32, {n_seqs});
  in.positions = Buffer(DType::I32, {in.n_tokens});
  in.block_table = Buffer(DType::I32, {n_seqs, nb});
  std::vector<int32_t> phys(size_t(in.n_blocks));
  std::iota(phys.begin(), phys.end(), 0);
  std::shuffle(phys.begin(), phys.end(), rng);
  for (int q = 0; q < n_seqs; ++q) {
    in.qsl.ptr<int32_t>()[q] = q * s_q;
    in.seq_lens.ptr<int32_t>()[q] = ctx;
    for (int b = 0; b < nb; ++b)
      in.block_table.ptr<int32_t>()[q * nb + b] = phys[size_t(q * nb + b)];
    for (int i = 0; i < s_q; ++i) in.positions.ptr<int32_t>()[q * s_q + i] = ctx - s_q + i;
  }
  in.qsl.ptr<int32_t>()[n_seqs] = int32_t(in.n_tokens);
  in.host = AttentionMeta{n_seqs,       int(in.n_tokens), block, in.qsl, in.seq_lens,
                          in.positions, in.block_table,   {},    {}};
  in.d_qsl = cuda::to_device(in.qsl);
  in.d_seq_lens = cuda::to_device(in.seq_lens);
  in.d_positions = cuda::to_device(in.positions);
  in.d_block_table = cuda::to_device(in.block_table);
  in.dev = AttentionMeta{n_seqs,         int(in.n_tokens), block, in.d_qsl, in.d_seq_lens,
                         in.d_positions, in.d_block_table, {},    {}};
  return in;
}

}  // namespace osprey::bench
