#include "eval/arith_task.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "eval/answer_extract.h"

namespace osprey::eval {

std::vector<ArithProblem> load_arith_problems(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail("cannot read the problem set '", path, "'");
  std::vector<ArithProblem> out;
  std::string line;
  for (int ln = 1; std::getline(f, line); ++ln) {
    if (line.empty()) continue;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      ArithProblem p;
      p.id = j.at("id").get<std::string>();
      p.question = j.at("question").get<std::string>();
      p.solution = j.value("solution", std::string());
      p.answer = j.at("answer").get<int64_t>();
      out.push_back(std::move(p));
    } catch (const nlohmann::json::exception& e) {
      fail(path, ":", ln, ": not a problem {\"id\", \"question\", \"answer\"}: ", e.what());
    }
  }
  if (out.empty()) fail("the problem set '", path, "' is empty");
  return out;
}

ScoredAnswer score_answer(const ArithProblem& p, const std::string& output) {
  ScoredAnswer s;
  s.extracted = flexible_extract(output);
  s.correct = answer_matches(s.extracted, std::to_string(p.answer));
  return s;
}

EvalSummary score_outputs(const std::vector<ArithProblem>& problems,
                          const std::vector<std::string>& outputs,
                          const std::string& failures_path) {
  OSPREY_CHECK(problems.size() == outputs.size(), "one output per problem");
  std::ofstream f;
  if (!failures_path.empty()) {
    f.open(failures_path);
    if (!f) fail("cannot write the failures file '", failures_path, "'");
  }
  EvalSummary s;
  s.n = int64_t(problems.size());
  for (size_t i = 0; i < problems.size(); ++i) {
    const ScoredAnswer a = score_answer(problems[i], outputs[i]);
    if (a.extracted == kInvalidAnswer) ++s.invalid;
    if (a.correct) {
      ++s.correct;
    } else if (f.is_open()) {
      const nlohmann::json j = {{"id", problems[i].id},
                                {"question", problems[i].question},
                                {"expected", problems[i].answer},
                                {"extracted", a.extracted},
                                {"output", outputs[i]}};
      // Model output may hold broken UTF-8 (a cut multi-byte character): replace, do not throw.
      f << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
  }
  s.accuracy = s.n ? double(s.correct) / double(s.n) : 0.0;
  s.ci95 = wilson_interval(s.correct, s.n);
  return s;
}

}  // namespace osprey::eval
