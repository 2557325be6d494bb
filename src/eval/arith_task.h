// The arithmetic word-problem task (issue #7): problems from tests/data/arith/*.jsonl (written by
// tools/arith/generate.py), the prompt the arithmetic model is trained on, and scoring.
//
// The prompt format (tools/train_arith.py trains on exactly this): the question alone as one user
// turn in the model's chat format, generation prompt added; the model answers with the worked
// solution, "... 37 - 12 = 25 ... The answer is 25.", then end-of-sentence. For a deepseek_v32
// model (chat format deepseek-v3.1, non-thinking) the prompt text is
//   <｜begin▁of▁sentence｜><｜User｜>{question}<｜Assistant｜></think>
// and the trained completion is "{solution}<｜end▁of▁sentence｜>".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "eval/interval.h"

namespace osprey::eval {

struct ArithProblem {
  std::string id;
  std::string question;
  std::string solution;  // the worked solution, ending "The answer is N."
  int64_t answer = 0;
};

// Reads one JSON object per line ({"id", "question", "solution", "answer"}); throws osprey::Error
// naming the file and line of anything malformed.
std::vector<ArithProblem> load_arith_problems(const std::string& path);

struct ScoredAnswer {
  std::string extracted;  // flexible_extract(output)
  bool correct = false;
};
ScoredAnswer score_answer(const ArithProblem& p, const std::string& output);

struct EvalSummary {
  int64_t n = 0, correct = 0, invalid = 0;  // invalid: no number in the output
  double accuracy = 0;
  Interval ci95;
};

// Scores outputs[i] against problems[i]; writes every failure as one JSON line
// {"id", "question", "expected", "extracted", "output"} to failures_path (when not empty; the
// file is written even when there are none).
EvalSummary score_outputs(const std::vector<ArithProblem>& problems,
                          const std::vector<std::string>& outputs,
                          const std::string& failures_path);

}  // namespace osprey::eval
