#include "model/moe_dispatch.h"

#include <algorithm>

#include "ops/tensor_ops.h"

namespace osprey {

namespace {
Tensor host_copy(Tensor t, Buffer& keep) {
  if (t.device == Device::CPU) return t;
  keep = Buffer(t.dtype, t.shape);
  ops::copy(keep, t);
  return keep.view();
}
}  // namespace

void moe_expert_parallel(Tensor out, Tensor x, Tensor topk_ids, Tensor topk_weights,
                         const std::vector<MlpWeights>& experts, const RankShard& shard,
                         dist::Communicator& comm, int64_t tok_begin, int64_t tok_end,
                         int64_t chunk, Workspace& ws) {
  Workspace::Scope scope(ws);
  const int world = comm.size();
  const int64_t T = x.size(0), D = x.size(1), K = topk_ids.size(1), W = D + 2;
  const int64_t n = tok_end - tok_begin;  // tokens this rank dispatches
  const int per_rank = shard.expert_end - shard.expert_begin;
  const Device dev = x.device;
  Buffer ids_h, wts_h;
  const int32_t* ids = host_copy(topk_ids, ids_h).ptr<int32_t>();
  const float* wts = host_copy(topk_weights, wts_h).f32();

  // Pairs p = k·n + t (k-major, so that the combine sums k slices of [n, D]), by destination.
  std::vector<int64_t> send_rows(size_t(world), 0);
  std::vector<std::vector<int64_t>> by_dest(static_cast<size_t>(world));
  for (int64_t k = 0; k < K; ++k)
    for (int64_t t = 0; t < n; ++t) {
      const int32_t e = ids[(tok_begin + t) * K + k];
      OSPREY_CHECK(e >= 0 && e / per_rank < world, "expert id ", e);
      by_dest[size_t(e / per_rank)].push_back(k * n + t);
    }
  const int64_t P = n * K;
  Buffer tok_idx(DType::I32, {P}), meta(DType::F32, {P, 2});  // per sent row: token, (id, weight)
  std::vector<int32_t> slot_of_pair(static_cast<size_t>(P));  // the pair's row in the send buffer
  int64_t row = 0;
  for (int d = 0; d < world; ++d) {
    send_rows[size_t(d)] = int64_t(by_dest[size_t(d)].size());
    for (int64_t p : by_dest[size_t(d)]) {
      const int64_t k = p / n, t = p % n;
      tok_idx.ptr<int32_t>()[row] = int32_t(tok_begin + t);
      const int32_t e = ids[(tok_begin + t) * K + k];
      meta.f32()[row * 2] = float(e % per_rank);  // exact: expert ids are far below 2^24
      meta.f32()[row * 2 + 1] = wts[(tok_begin + t) * K + k];
      slot_of_pair[size_t(p)] = int32_t(row++);
    }
  }
  const std::vector<int64_t> m = dist::all_gather_counts(comm, send_rows);
  std::vector<int64_t> recv_rows(static_cast<size_t>(world));
  int64_t R = 0;
  for (int i = 0; i < world; ++i) R += recv_rows[size_t(i)] = m[size_t(i * world + comm.rank())];
  auto elems = [](std::vector<int64_t> v, int64_t w) {
    for (int64_t& c : v) c *= w;
    return v;
  };

  // Dispatch: [P, D + 2] rows out, [R, D + 2] in.
  Tensor send = ws.alloc(DType::F32, {std::max<int64_t>(P, 1), W});
  if (P > 0) {
    const Storage idx_dev = to_device_storage(tok_idx, dev),
                  meta_dev = to_device_storage(meta, dev);
    Tensor xs = ws.alloc(DType::F32, {P, D});  // [P, D]
    ops::gather_rows(xs, x, idx_dev.view());
    ops::copy_columns(send.rows(0, P), 0, xs, 0, D);
    ops::copy_columns(send.rows(0, P), D, meta_dev.view(), 0, 2);
  }
  Tensor recv = ws.alloc(DType::F32, {std::max<int64_t>(R, 1), W});
  comm.all_to_allv(recv, elems(recv_rows, W), send, elems(send_rows, W));

  // This rank's experts over the received pairs (one pair per row).
  Tensor y = ws.alloc(DType::F32, {std::max<int64_t>(R, 1), D});  // [R, D] weighted outputs
  if (R > 0) {
    Tensor xr = ws.alloc(DType::F32, {R, D});
    ops::copy_columns(xr, 0, recv.rows(0, R), 0, D);
    Buffer mr(DType::F32, {R, 2});
    Tensor mr_dev = dev == Device::CPU ? Tensor(mr) : ws.alloc(DType::F32, {R, 2});
    ops::copy_columns(mr_dev, 0, recv.rows(0, R), D, 2);
    if (mr_dev.data != mr.view().data) ops::copy(mr, mr_dev);
    Buffer lid(DType::I32, {R, 1}), lw(DType::F32, {R, 1});
    for (int64_t i = 0; i < R; ++i) {
      lid.ptr<int32_t>()[i] = int32_t(mr.f32()[i * 2]);
      lw.f32()[i] = mr.f32()[i * 2 + 1];
    }
    const Storage lid_dev = to_device_storage(lid, dev), lw_dev = to_device_storage(lw, dev);
    ops::moe_experts(y.rows(0, R), xr, lid_dev.view(), lw_dev.view(), experts);
  }

  // Combine: [R, D] back, [P, D] in send order; then per token Σ_k.
  Tensor back = ws.alloc(DType::F32, {std::max<int64_t>(P, 1), D});
  comm.all_to_allv(back, elems(send_rows, D), y, elems(recv_rows, D));
  const bool gathered = shard.split_tp();
  Tensor mine = gathered ? ws.alloc(DType::F32, {std::max<int64_t>(chunk, 1), D}) : out;
  if (n > 0) {
    Buffer order(DType::I32, {P});
    std::copy(slot_of_pair.begin(), slot_of_pair.end(), order.ptr<int32_t>());
    const Storage order_dev = to_device_storage(order, dev);
    Tensor by_k = ws.alloc(DType::F32, {P, D});  // [K, n, D]
    ops::gather_rows(by_k, back.rows(0, P), order_dev.view());
    ops::copy(mine.rows(0, n), by_k.rows(0, n));
    for (int64_t k = 1; k < K; ++k)
      ops::add(mine.rows(0, n), mine.rows(0, n), by_k.rows(k * n, (k + 1) * n));
  }
  if (!gathered) return;
  // TP + EP: every rank's share of the tokens into `out` (shares padded to `chunk` rows).
  Tensor all = ws.alloc(DType::F32, {int64_t(world) * chunk, D});
  comm.all_gather(all, mine.rows(0, chunk));
  ops::copy(out, all.rows(0, T));
}

}  // namespace osprey
