#include "bench/comm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <thread>

#include "core/error.h"
#include "core/storage.h"
#include "dist/local_ranks.h"
#include "dist/nccl_comm.h"
#include "ops/tensor_ops.h"

namespace osprey::bench {

double bus_bandwidth_factor(const std::string& op, int world) {
  if (world < 1) fail("bench comm: world size must be at least 1, got ", world);
  const double w = world;
  if (op == "all_reduce") return 2.0 * (w - 1) / w;
  if (op == "all_to_all") return (w - 1) / w;
  fail("bench comm: unknown collective '", op, "' (all_reduce or all_to_all)");
}

namespace {
// Rows of [hidden + 2] F32 a rank sends to each rank: its T·topk (token, expert) pairs spread
// evenly, rounded up (at least one row, so that every pair of ranks exchanges data).
int64_t rows_per_peer(int64_t tokens, const CommBenchOptions& o, int world) {
  return std::max<int64_t>(1, (tokens * o.topk + world - 1) / world);
}
constexpr int64_t kDispatchExtra = 2;  // the EP row's local expert id and routing weight
}  // namespace

int64_t comm_message_bytes(const std::string& op, int64_t tokens, const CommBenchOptions& o,
                           int world) {
  const int64_t f32 = 4;
  if (op == "all_reduce") return tokens * o.hidden * f32;
  if (op == "all_to_all")
    return world * rows_per_peer(tokens, o, world) * (o.hidden + kDispatchExtra) * f32;
  fail("bench comm: unknown collective '", op, "'");
}

namespace {
using Clock = std::chrono::steady_clock;

// `n` F32 elements equal to v, on `dev`.
Storage filled(Device dev, int64_t n, float v) {
  Buffer h(DType::F32, {n});
  std::fill(h.f32(), h.f32() + n, v);
  return to_device_storage(h.view(), dev);
}

Buffer to_host(Tensor t) {
  Buffer h(t.dtype, t.shape);
  ops::copy(h.view(), t);
  return h;
}

// One size of one op: the first call checked, `warmup` more untimed, `iters` timed.
CommBenchRow time_op(dist::Communicator& c, dist::Communicator& host, const std::string& op,
                     int64_t tokens, const CommBenchOptions& o) {
  const int world = c.size(), rank = c.rank();
  const Device dev = c.device();
  const float mine = float(rank + 1);
  std::function<void()> call;
  std::function<void()> check;
  Storage a, b;
  std::vector<int64_t> counts;
  if (op == "all_reduce") {
    const int64_t n = tokens * o.hidden;  // [T, hidden]
    a = filled(dev, n, mine);
    call = [&] { c.all_reduce_sum(a.view()); };
    check = [&, n] {  // n by value: it ends with this block, the lambda is called after
      const Buffer h = to_host(a.view());
      const float want = float(world) * float(world + 1) / 2;
      for (int64_t i : {int64_t(0), n / 2, n - 1})
        if (h.f32()[i] != want)
          fail("bench comm: all_reduce on rank ", rank, " gave ", h.f32()[i], " at element ", i,
               ", expected ", want);
    };
  } else {
    const int64_t seg = rows_per_peer(tokens, o, world) * (o.hidden + kDispatchExtra);
    a = filled(dev, seg * world, mine);  // [W · rows, hidden + 2] sent, rank-major
    b = filled(dev, seg * world, 0);     // received
    counts.assign(size_t(world), seg);
    call = [&] { c.all_to_allv(b.view(), counts, a.view(), counts); };
    check = [&, seg] {  // seg by value, as n above
      const Buffer h = to_host(b.view());
      for (int i = 0; i < world; ++i)
        for (int64_t e : {i * seg, i * seg + seg - 1})
          if (h.f32()[e] != float(i + 1))
            fail("bench comm: all_to_all on rank ", rank, " received ", h.f32()[e], " from rank ",
                 i, ", expected ", i + 1);
    };
  }
  call();
  check();
  for (int i = 0; i < o.warmup; ++i) call();
  Buffer times(DType::F32, {int64_t(o.iters)});  // [iters] this rank's seconds
  for (int i = 0; i < o.iters; ++i) {
    c.barrier();
    const auto t0 = Clock::now();
    call();
    times.f32()[i] = std::chrono::duration<float>(Clock::now() - t0).count();
  }
  Buffer all(DType::F32, {int64_t(world), int64_t(o.iters)});  // [W, iters]
  host.all_gather(all.view(), times.view());
  std::vector<double> slowest(size_t(o.iters), 0);
  for (int r = 0; r < world; ++r)
    for (int i = 0; i < o.iters; ++i)
      slowest[size_t(i)] = std::max(slowest[size_t(i)], double(all.f32()[r * o.iters + i]));
  std::sort(slowest.begin(), slowest.end());
  const size_t m = slowest.size();
  CommBenchRow row;
  row.op = op;
  row.tokens = tokens;
  row.bytes = comm_message_bytes(op, tokens, o, world);
  row.median_s = m % 2 ? slowest[m / 2] : (slowest[m / 2 - 1] + slowest[m / 2]) / 2;
  row.median_s = std::max(row.median_s, 1e-9);  // a clock tick, never a division by zero
  row.algbw_gbs = double(row.bytes) / row.median_s / 1e9;
  row.busbw_gbs = row.algbw_gbs * bus_bandwidth_factor(op, world);
  return row;
}
}  // namespace

std::vector<CommBenchRow> run_comm_rank(dist::Communicator& data, dist::Communicator& host,
                                        const CommBenchOptions& o) {
  if (o.tokens.empty()) fail("bench comm: no token counts");
  for (int64_t t : o.tokens)
    if (t < 1) fail("bench comm: token counts must be at least 1, got ", t);
  if (o.hidden < 1 || o.topk < 1 || o.iters < 1 || o.warmup < 0)
    fail("bench comm: --hidden, --topk and --iters must be at least 1, --warmup at least 0");
  std::vector<CommBenchRow> rows;
  for (const char* op : {"all_reduce", "all_to_all"}) {
    if ((std::string(op) == "all_reduce" && !o.all_reduce) ||
        (std::string(op) == "all_to_all" && !o.all_to_all))
      continue;
    for (int64_t t : o.tokens) rows.push_back(time_op(data, host, op, t, o));
  }
  return rows;
}

std::string format_comm_table(const std::vector<CommBenchRow>& rows, int world,
                              const std::string& backend) {
  std::string s = str_cat("bench comm: ", world, " ranks (", backend,
                          "), medians; busbw = algbw x 2(W-1)/W (all_reduce), x (W-1)/W "
                          "(all_to_all)\n");
  char line[200];
  std::snprintf(line, sizeof line, "%-11s %7s %14s %12s %12s %12s\n", "op", "tokens", "bytes",
                "time (us)", "algbw GB/s", "busbw GB/s");
  s += line;
  for (const CommBenchRow& r : rows) {
    std::snprintf(line, sizeof line, "%-11s %7lld %14lld %12.1f %12.3f %12.3f\n", r.op.c_str(),
                  static_cast<long long>(r.tokens), static_cast<long long>(r.bytes),
                  r.median_s * 1e6, r.algbw_gbs, r.busbw_gbs);
    s += line;
  }
  return s;
}

std::vector<CommBenchRow> run_comm_benchmark(const dist::ParallelConfig& p, Device device,
                                             const CommBenchOptions& o) {
  p.validate();
  const int world = p.world_size(), local = p.ranks_per_node(), first = p.first_local_rank();
  if (device == Device::CUDA && local != 1)
    fail("bench comm on CUDA: one rank per process; launch ", world, " processes with --nnodes ",
         world, " --node-rank r (as osprey serve's ranks)");
  // [local ranks]
  std::vector<std::unique_ptr<dist::Communicator>> host = dist::make_local_control_ranks(p, device);
  std::unique_ptr<dist::Communicator> nccl;
  if (device == Device::CUDA) nccl = dist::make_nccl_communicator(*host[0]);
  std::vector<std::vector<CommBenchRow>> rows(static_cast<size_t>(local));
  std::vector<std::string> errs(static_cast<size_t>(local));
  auto rank_main = [&](int i) {
    dist::Communicator& data = nccl ? *nccl : *host[size_t(i)];
    try {
      rows[size_t(i)] = run_comm_rank(data, *host[size_t(i)], o);
    } catch (const std::exception& e) {
      errs[size_t(i)] = e.what();
      host[size_t(i)]->abort(e.what());
      if (nccl) nccl->abort(e.what());
    }
  };
  std::vector<std::thread> ts;
  for (int i = 1; i < local; ++i) ts.emplace_back(rank_main, i);
  rank_main(0);
  for (auto& t : ts) t.join();
  for (const auto& e : errs)
    if (!e.empty()) fail(e);
  if (first != 0) return {};
  const dist::Communicator& data = nccl ? *nccl : *host[0];
  std::fputs(format_comm_table(rows[0], world, data.backend()).c_str(), stdout);
  std::fflush(stdout);
  return rows[0];
}

}  // namespace osprey::bench
