// The CUDA graph runner's host side (engine/cuda_graph_runner.h, engine/cuda_graph_metadata.h),
// which runs without a GPU: vLLM's capture sizes, the bucket of a batch, which steps may replay a
// graph (pure decodes, and verify steps of 1 + K tokens a sequence) and under which key, the
// padded metadata of a bucket of q tokens a sequence under the shrink-tail rule, which prepared
// samplings the graph can take (the rest fall back to the host path), the staging of the sampling
// rows under the shrink-tail rule, and the clear refusal of --cuda-graph for a CPU model.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/storage.h"
#include "engine/cuda_graph_runner.h"
#include "engine/engine.h"
#include "model/greedy.h"

namespace osprey {
namespace {

TEST(CudaGraphBuckets, CaptureSizesAreVllms) {
  EXPECT_EQ(cuda_graph_capture_sizes(1), (std::vector<int>{1}));
  EXPECT_EQ(cuda_graph_capture_sizes(3), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(cuda_graph_capture_sizes(8), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(cuda_graph_capture_sizes(20), (std::vector<int>{1, 2, 4, 8, 16, 20}));
  EXPECT_EQ(cuda_graph_capture_sizes(64),
            (std::vector<int>{1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64}));
  EXPECT_EQ(cuda_graph_capture_sizes(100),
            (std::vector<int>{1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 100}));
}

TEST(CudaGraphBuckets, SmallestBucketThatHoldsTheBatch) {
  const std::vector<int> s = cuda_graph_capture_sizes(64);
  EXPECT_EQ(cuda_graph_bucket(s, 1), 1);
  EXPECT_EQ(cuda_graph_bucket(s, 3), 4);
  EXPECT_EQ(cuda_graph_bucket(s, 5), 8);
  EXPECT_EQ(cuda_graph_bucket(s, 8), 8);
  EXPECT_EQ(cuda_graph_bucket(s, 9), 16);
  EXPECT_EQ(cuda_graph_bucket(s, 33), 40);
  EXPECT_EQ(cuda_graph_bucket(s, 54), 56);  // the 5000/500/64 wave's mean decode batch
  EXPECT_EQ(cuda_graph_bucket(s, 57), 64);
  EXPECT_EQ(cuda_graph_bucket(s, 65), 0);  // larger than every bucket: eager
}

std::vector<int32_t> blocks(int first) {
  return {first, first + 1};
}

TEST(CudaGraphBuckets, OnlyPureDecodeStepsReplay) {
  // Three decodes: eligible.
  OwnedBatch decode(
      {SeqStep{{5}, 10, blocks(0)}, SeqStep{{6}, 70, blocks(2)}, SeqStep{{7}, 3, blocks(4)}}, 64);
  EXPECT_EQ(cuda_graph_ineligible(decode.batch()), "");
  // A prompt chunk in the batch (mixed): eager.
  OwnedBatch mixed({SeqStep{{5}, 10, blocks(0)}, SeqStep{{1, 2, 3}, 0, blocks(2)}}, 64);
  EXPECT_NE(cuda_graph_ineligible(mixed.batch()), "");
  // A verify step (1 + drafts, every row sampled) without the verify flag (a uniform prompt
  // chunk of two tokens: the expanded path, not the decode path): eager.
  OwnedBatch verify({SeqStep{{5, 6}, 10, blocks(0), true}}, 64);
  ForwardBatch vb = verify.batch();
  EXPECT_NE(cuda_graph_ineligible(vb), "");
  // With the flag it replays (verify graphs: the next test).
  vb.spec_decode = true;
  EXPECT_EQ(cuda_graph_ineligible(vb), "");
  // One-token steps of which one is not sampled (a mid-prompt chunk of one token): eager.
  ForwardBatch partial = decode.batch();
  partial.logits_indices = partial.logits_indices.rows(0, 2);
  EXPECT_NE(cuda_graph_ineligible(partial), "");
  // An empty batch: eager.
  EXPECT_NE(cuda_graph_ineligible(ForwardBatch{}), "");
}

// Verify steps: B sequences of 1 + K tokens each, every token sampled in order, replay the graph
// keyed (bucket, 1 + K); uneven runs, unsampled rows, more than kMaxGraphTokensPerSeq tokens, or
// a verify flag without drafts are eager, each with its reason.
TEST(CudaGraphBuckets, UniformVerifyStepsReplayKeyedByTokensPerSequence) {
  const std::vector<int> sizes = cuda_graph_capture_sizes(16);
  auto verify = [](int n_seqs, int q) {
    std::vector<SeqStep> s;
    for (int r = 0; r < n_seqs; ++r) {
      std::vector<int32_t> t(static_cast<size_t>(q));
      for (int i = 0; i < q; ++i) t[size_t(i)] = 10 * r + i + 2;
      s.push_back(SeqStep{t, 20 + 7 * r, blocks(2 * r), true});
    }
    return s;
  };
  for (int K = 1; K <= kMaxSpeculativeTokens; ++K) {
    for (int B : {1, 3, 5, 9}) {
      SCOPED_TRACE("K=" + std::to_string(K) + " B=" + std::to_string(B));
      OwnedBatch ob(verify(B, 1 + K), 64);
      ForwardBatch b = ob.batch();
      b.spec_decode = true;
      EXPECT_EQ(cuda_graph_ineligible(b), "");
      EXPECT_EQ(cuda_graph_tokens_per_seq(b), 1 + K);
      const GraphKey key = cuda_graph_key(sizes, b);
      EXPECT_EQ(key.bucket, cuda_graph_bucket(sizes, B));
      EXPECT_EQ(key.tokens_per_seq, 1 + K);
    }
  }
  // Decode and verify keys of one bucket are distinct graphs.
  EXPECT_LT((GraphKey{4, 1}), (GraphKey{4, 2}));
  EXPECT_NE((GraphKey{4, 1}), (GraphKey{4, 2}));
  // Uneven runs: one sequence of 3 tokens, one of 2.
  std::vector<SeqStep> uneven = verify(2, 3);
  uneven[1].tokens.pop_back();
  OwnedBatch ub(uneven, 64);
  ForwardBatch u = ub.batch();
  u.spec_decode = true;
  EXPECT_NE(cuda_graph_ineligible(u).find("different numbers"), std::string::npos);
  EXPECT_EQ(cuda_graph_key(sizes, u).bucket, 0);
  // 1 + 4 tokens a sequence: more drafts than --speculative-config allows.
  OwnedBatch wide(verify(2, kMaxGraphTokensPerSeq + 1), 64);
  ForwardBatch w = wide.batch();
  w.spec_decode = true;
  EXPECT_NE(cuda_graph_ineligible(w), "");
  // Only the last token of each sequence sampled (a verify must sample every row).
  std::vector<SeqStep> last = verify(2, 2);
  for (SeqStep& s : last) s.all_logits = false;
  OwnedBatch lb(last, 64);
  ForwardBatch l = lb.batch();
  l.spec_decode = true;
  EXPECT_NE(cuda_graph_ineligible(l).find("every token"), std::string::npos);
  // A one-token step flagged as a verify.
  OwnedBatch one(verify(2, 1), 64);
  ForwardBatch o = one.batch();
  o.spec_decode = true;
  EXPECT_NE(cuda_graph_ineligible(o), "");
}

// A bucket's host staging (four host buffers standing in for the device region's twin).
struct Staging {
  std::vector<int32_t> tok, pos, lens, qsl, req, li, table;
  std::vector<int64_t> slot;
  GraphMetadataHost m;
  Staging(int Bp, int q, int W)
      : tok(size_t(Bp * q), -7),
        pos(size_t(Bp * q), -7),
        lens(size_t(Bp), -7),
        qsl(size_t(Bp + 1), -7),
        req(size_t(Bp * q), -7),
        li(size_t(Bp * q), -7),
        table(size_t(Bp * W), -7),
        slot(size_t(Bp * q), -7) {
    m.size = Bp;
    m.tokens_per_seq = q;
    m.table_width = W;
    m.token_ids = tok.data();
    m.positions = pos.data();
    m.seq_lens = lens.data();
    m.query_start_loc = qsl.data();
    m.req_id_per_token = req.data();
    m.logits_indices = li.data();
    m.slot_mapping = slot.data();
    m.block_table = table.data();
    init_graph_metadata(m);
  }
};

// Padding that crosses an op's token threshold is named (the runner then runs the step eagerly);
// the default decode buckets never cross 32 or 128, some verify buckets do.
TEST(CudaGraphBuckets, PaddingAcrossAKernelThresholdIsNamed) {
  const std::vector<int64_t> t = {32, 128};  // ops::cuda::token_path_thresholds()'s defaults
  EXPECT_EQ(cuda_graph_crossed_threshold(27, 48, t), 32);  // 9 × 3 tokens in the 16 bucket
  EXPECT_EQ(cuda_graph_crossed_threshold(32, 33, t), 32);  // the edge itself
  EXPECT_EQ(cuda_graph_crossed_threshold(33, 48, t), 0);   // both above 32, below 128
  EXPECT_EQ(cuda_graph_crossed_threshold(18, 32, t), 0);   // 9 × 2 in 16 × 2: at 32, not past
  EXPECT_EQ(cuda_graph_crossed_threshold(100, 160, t), 128);
  EXPECT_EQ(cuda_graph_crossed_threshold(129, 200, t), 0);
  EXPECT_EQ(cuda_graph_crossed_threshold(5, 8, t), 0);
  EXPECT_EQ(cuda_graph_crossed_threshold(27, 48, {}), 0);
  const std::vector<int> sizes = cuda_graph_capture_sizes(512);
  for (int n = 1; n <= 512; ++n)
    EXPECT_EQ(cuda_graph_crossed_threshold(n, cuda_graph_bucket(sizes, n), t), 0) << n;
  int crossing = 0;  // verify steps of 3 tokens a sequence in the default buckets
  for (int n = 1; n <= 64; ++n)
    crossing += cuda_graph_crossed_threshold(3 * n, 3 * cuda_graph_bucket(sizes, n), t) != 0;
  EXPECT_GT(crossing, 0);
}

TEST(CudaGraphBuckets, VerifyBucketMetadataPadsWholeSequencesWithTheShrinkTail) {
  constexpr int kBp = 4, kQ = 3, kW = 3, kBlock = 64;  // K = 2 drafts
  Staging st(kBp, kQ, kW);
  // The parts fixed for the key: runs of q tokens, every token sampled.
  for (int r = 0; r <= kBp; ++r) EXPECT_EQ(st.qsl[size_t(r)], r * kQ);
  for (int t = 0; t < kBp * kQ; ++t) {
    EXPECT_EQ(st.req[size_t(t)], t / kQ);
    EXPECT_EQ(st.li[size_t(t)], t);
  }
  // Three sequences: contexts 70, 20, 130 after the step (2, 1, 3 blocks).
  auto seqs = [](int n, int first_block) {
    std::vector<SeqStep> s;
    const int starts[] = {67, 17, 127, 40};
    for (int r = 0; r < n; ++r) {
      const int b0 = first_block + 10 * r;
      s.push_back(SeqStep{{100 + r, 200 + r, 300 + r}, starts[r], {b0, b0 + 1, b0 + 2}, true});
    }
    return s;
  };
  auto stage = [&](const std::vector<SeqStep>& s) {
    OwnedBatch ob(s, kBlock);
    ForwardBatch b = ob.batch();
    b.spec_decode = true;
    EXPECT_EQ(cuda_graph_ineligible(b), "");
    return stage_graph_metadata(st.m, b);
  };
  auto expect_real = [&](const std::vector<SeqStep>& s) {
    for (size_t r = 0; r < s.size(); ++r) {
      const int ctx = s[r].start_pos + kQ;
      EXPECT_EQ(st.lens[r], ctx) << "row " << r;
      for (int i = 0; i < kQ; ++i) {
        const size_t t = r * kQ + size_t(i);
        const int p = s[r].start_pos + i;
        EXPECT_EQ(st.tok[t], s[r].tokens[size_t(i)]) << "token " << t;
        EXPECT_EQ(st.pos[t], p) << "token " << t;
        EXPECT_EQ(st.slot[t], int64_t(s[r].blocks[size_t(p / kBlock)]) * kBlock + p % kBlock)
            << "token " << t;
      }
      for (int k = 0; k < (ctx + kBlock - 1) / kBlock; ++k)
        EXPECT_EQ(st.table[r * kW + size_t(k)], s[r].blocks[size_t(k)]) << "row " << r;
    }
  };
  // A padding row: q tokens 0 at positions 0..q-1, seq_len q, no cache slot, entry 0 = row 0's
  // first block.
  auto expect_padding = [&](int r, int32_t block) {
    for (int i = 0; i < kQ; ++i) {
      const size_t t = size_t(r * kQ + i);
      EXPECT_EQ(st.tok[t], 0) << "padding token " << t;
      EXPECT_EQ(st.pos[t], i) << "padding token " << t;
      EXPECT_EQ(st.slot[t], -1) << "padding token " << t;
    }
    EXPECT_EQ(st.lens[size_t(r)], kQ) << "padding row " << r;
    EXPECT_EQ(st.table[size_t(r * kW)], block) << "padding row " << r;
  };
  // Never staged: the padding row is written.
  std::vector<SeqStep> s = seqs(3, 0);
  EXPECT_EQ(stage(s), 1);
  expect_real(s);
  expect_padding(3, 0);
  // 3 → 2: row 2 shrank off and is reset; row 3 (padding already) is left alone.
  s = seqs(2, 0);
  st.tok[3 * kQ] = 55;  // a marker: row 3 must not be rewritten
  EXPECT_EQ(stage(s), 1);
  expect_real(s);
  expect_padding(2, 0);
  EXPECT_EQ(st.tok[3 * kQ], 55);
  st.tok[3 * kQ] = 0;
  // 2 → 2: nothing to rewrite.
  EXPECT_EQ(stage(s), 0);
  // Row 0's first block moved (a preemption): every padding row's entry 0 follows it, nothing
  // else of them is rewritten.
  s = seqs(2, 1);
  EXPECT_EQ(stage(s), 2);
  expect_real(s);
  expect_padding(2, 1);
  expect_padding(3, 1);
  // A full bucket: no padding row.
  s = seqs(4, 1);
  EXPECT_EQ(stage(s), 0);
  expect_real(s);
  // The fixed parts are never touched by a staging.
  for (int r = 0; r <= kBp; ++r) EXPECT_EQ(st.qsl[size_t(r)], r * kQ);
  for (int t = 0; t < kBp * kQ; ++t) EXPECT_EQ(st.li[size_t(t)], t);
  // A step of another tokens-per-sequence, or more rows than the bucket, is an internal error.
  OwnedBatch two({SeqStep{{1, 2}, 5, {0}, true}}, kBlock);
  EXPECT_DEATH(stage_graph_metadata(st.m, two.batch()), "graph bucket of 4");
}

// The decode bucket (q = 1) keeps the layout and rule of before: positions 0, seq_len 1.
TEST(CudaGraphBuckets, DecodeBucketMetadataIsTheOneTokenCase) {
  Staging st(4, 1, 2);
  for (int r = 0; r <= 4; ++r) EXPECT_EQ(st.qsl[size_t(r)], r);
  OwnedBatch ob({SeqStep{{5}, 10, {3, 4}}, SeqStep{{6}, 70, {8, 9}}}, 64);
  EXPECT_EQ(stage_graph_metadata(st.m, ob.batch()), 2);
  for (int r = 2; r < 4; ++r) {
    EXPECT_EQ(st.tok[size_t(r)], 0);
    EXPECT_EQ(st.pos[size_t(r)], 0);
    EXPECT_EQ(st.lens[size_t(r)], 1);
    EXPECT_EQ(st.slot[size_t(r)], -1);
    EXPECT_EQ(st.table[size_t(r * 2)], 3);
  }
  EXPECT_EQ(st.lens[1], 71);
  EXPECT_EQ(st.table[2], 8);
  EXPECT_EQ(st.table[3], 9);
}

// A prepared sampling of n rows: greedy rows, `lists` ids listed, logprobs on row 0 if asked.
struct Prepared {
  std::vector<SampleRowParams> rows;
  std::vector<int32_t> lists;
  GraphSampling gs;
  Prepared(int n, size_t lists_size, bool logprobs) {
    rows.assign(size_t(n), SampleRowParams{});
    for (int r = 0; r < n; ++r) rows[size_t(r)].seed = uint64_t(100 + r);
    lists.assign(lists_size, 1);
    if (logprobs) {
      rows[0].logprobs = 5;
      rows[0].logprob_row = 0;
    }
    gs.rows = &rows;
    gs.lists = &lists;
    gs.n_logprob_rows = logprobs ? 1 : 0;
  }
};

TEST(CudaGraphBuckets, InGraphSamplingOrTheHostPath) {
  // Fits: plain rows, logprobs, lists up to the bucket's capacity.
  EXPECT_EQ(cuda_graph_sampling_unsupported(Prepared(3, 0, false).gs, 3, 4), "");
  EXPECT_EQ(cuda_graph_sampling_unsupported(Prepared(3, 10, true).gs, 3, 4), "");
  const size_t cap = size_t(4) * kGraphSampleListPerRow;
  EXPECT_EQ(cuda_graph_sampling_unsupported(Prepared(3, cap, false).gs, 3, 4), "");
  // One id past the capacity (a new penalty slot's prompt): the host path, with the reason.
  const std::string over = cuda_graph_sampling_unsupported(Prepared(3, cap + 1, false).gs, 3, 4);
  EXPECT_NE(over.find("capacity"), std::string::npos) << over;
  // A larger bucket holds it.
  EXPECT_EQ(cuda_graph_sampling_unsupported(Prepared(3, cap + 1, false).gs, 3, 8), "");
  // Not one row per sequence, no rows at all, logprob rows that do not match.
  EXPECT_NE(cuda_graph_sampling_unsupported(Prepared(2, 0, false).gs, 3, 4), "");
  EXPECT_NE(cuda_graph_sampling_unsupported(GraphSampling{}, 3, 4), "");
  Prepared bad_lp(3, 0, true);
  bad_lp.gs.n_logprob_rows = 0;  // row 0 asks for logprobs but no row is counted
  EXPECT_NE(cuda_graph_sampling_unsupported(bad_lp.gs, 3, 4).find("logprob"), std::string::npos);
  // A penalty slot needs the penalty state on the GPU (a CPU state cannot be read by the graph).
  Prepared pen(3, 4, false);
  pen.rows[1].penalty_slot = 0;
  Storage mask(Device::CPU, DType::I32, {4, 2}), counts(Device::CPU, DType::I32, {4, 64});
  pen.gs.prompt_mask = mask.view();
  pen.gs.output_counts = counts.view();
  EXPECT_NE(cuda_graph_sampling_unsupported(pen.gs, 3, 4).find("penalty state"), std::string::npos);
  pen.gs.prompt_mask = pen.gs.output_counts = Tensor{};  // none at all
  EXPECT_NE(cuda_graph_sampling_unsupported(pen.gs, 3, 4), "");
  pen.rows[1].penalty_slot = -1;  // without the slot the state is not read
  EXPECT_EQ(cuda_graph_sampling_unsupported(pen.gs, 3, 4), "");
}

TEST(CudaGraphBuckets, SamplingRowsStagedWithTheShrinkTail) {
  constexpr int kBucket = 8;
  const SampleRowParams pad = graph_padding_sample_row();
  EXPECT_LT(pad.temperature, kGreedyTemperature);  // greedy: no draw, no state
  EXPECT_EQ(pad.logprobs, -1);
  EXPECT_EQ(pad.penalty_slot, -1);
  EXPECT_EQ(pad.suppress_count, 0);
  std::vector<SampleRowParams> staged(kBucket);
  // A marker in every staged row, so that a row the staging must leave alone is seen untouched.
  auto mark = [&] {
    for (SampleRowParams& p : staged) p.seed = 0xdead;
  };
  auto rows = [](int n, uint64_t base) {
    std::vector<SampleRowParams> r(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      r[size_t(i)].seed = base + uint64_t(i);
      r[size_t(i)].temperature = 0.7f;
      r[size_t(i)].step = uint64_t(i) * 3;
    }
    return r;
  };
  auto same = [](const SampleRowParams& a, const SampleRowParams& b) {
    return std::memcmp(&a, &b, sizeof a) == 0;
  };
  mark();
  // Never staged: every padding row is written.
  EXPECT_EQ(stage_graph_sample_rows(staged.data(), kBucket, -1, rows(7, 10)), 1);
  for (int r = 0; r < 7; ++r) EXPECT_TRUE(same(staged[size_t(r)], rows(7, 10)[size_t(r)]));
  EXPECT_TRUE(same(staged[7], pad));
  // 7 → 5: rows 5 and 6 shrank off and are reset; row 7 (padding already) is left alone.
  mark();
  EXPECT_EQ(stage_graph_sample_rows(staged.data(), kBucket, 7, rows(5, 20)), 2);
  for (int r = 0; r < 5; ++r) EXPECT_TRUE(same(staged[size_t(r)], rows(5, 20)[size_t(r)]));
  EXPECT_TRUE(same(staged[5], pad));
  EXPECT_TRUE(same(staged[6], pad));
  EXPECT_EQ(staged[7].seed, 0xdeadu);
  // 5 → 5: nothing shrank; 5 → 6: row 5 is real again, rows 6 and 7 untouched.
  mark();
  EXPECT_EQ(stage_graph_sample_rows(staged.data(), kBucket, 5, rows(5, 30)), 0);
  for (int r = 5; r < kBucket; ++r) EXPECT_EQ(staged[size_t(r)].seed, 0xdeadu);
  mark();
  EXPECT_EQ(stage_graph_sample_rows(staged.data(), kBucket, 5, rows(6, 40)), 0);
  EXPECT_TRUE(same(staged[5], rows(6, 40)[5]));
  EXPECT_EQ(staged[6].seed, 0xdeadu);
  // A full bucket; no row, or more rows than the bucket, is an internal error that stops loudly.
  EXPECT_EQ(stage_graph_sample_rows(staged.data(), kBucket, 6, rows(8, 50)), 0);
  EXPECT_DEATH(stage_graph_sample_rows(staged.data(), kBucket, 8, {}), "0 sampling rows");
  EXPECT_DEATH(stage_graph_sample_rows(staged.data(), kBucket, 8, rows(9, 60)), "9 sampling rows");
}

TEST(CudaGraphBuckets, CpuModelRefusesCudaGraphsClearly) {
  const auto m = load_model_cpu(OSPREY_BUNDLED_MODEL);
  EngineConfig ec;
  ec.max_num_seqs = 4;
  ec.max_model_len = 128;
  ec.num_blocks = 8;
  ec.cuda_graph = true;
  try {
    Engine e(*m, ec);
    FAIL() << "an engine with CUDA graphs on a CPU model was made";
  } catch (const Error& err) {
    const std::string what = err.what();
    EXPECT_NE(what.find("--cuda-graph"), std::string::npos) << what;
  }
  ec.cuda_graph = false;  // the default: the CPU engine as before
  Engine e(*m, ec);
  EXPECT_EQ(e.stats().cuda_graph_replays, 0);
}

}  // namespace
}  // namespace osprey
