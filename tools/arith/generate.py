#!/usr/bin/env python3
"""Arithmetic word problems with worked solutions, in the GSM8K manner (pure Python, no packages).

Each problem is a dict {"id", "question", "solution", "answer"}: two or three steps of + - * /
on whole numbers, every intermediate and final result a positive whole number of at most
MAX_RESULT, and a solution whose sentences each carry one equation "a op b = c" and whose last
sentence is "The answer is N.".

Deterministic: problem i of a split comes from random.Random(SPLIT_BASE[split] + i) alone, so any
problem can be regenerated from its split and index. The splits use disjoint seed ranges: training
takes seeds [0, 900_000_000), dev [900_000_000, 1_000_000_000), test [1_000_000_000, ...).
`training_problems` additionally skips any problem whose question text is in a held-out set, so a
test question can never be trained on even if two seeds happen to draw the same numbers.

  python3 tools/arith/generate.py --split test --n 1000 --out tests/data/arith/test.jsonl
  python3 tools/arith/generate.py --split train --n 5 --print
  python3 tools/arith/generate.py --chat-samples --n 30 --out /tmp/arith_chat.jsonl
"""
import argparse
import json
import random
import re
import sys

SPLIT_BASE = {"train": 0, "dev": 900_000_000, "test": 1_000_000_000}
TRAIN_SEED_LIMIT = SPLIT_BASE["dev"]
MAX_RESULT = 999

NAMES = ["Ann", "Ben", "Carla", "Dev", "Emma", "Farid", "Gus", "Hana", "Ivan", "Jade", "Kofi",
         "Lena", "Maria", "Nico", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara", "Uma", "Victor",
         "Wen", "Yusuf", "Zoe"]
SHOP_ITEMS = ["apples", "oranges", "pencils", "notebooks", "candles", "mugs", "toys", "books",
              "lemons", "shirts"]
BAKED = ["cookies", "muffins", "cupcakes", "rolls", "pies", "waffles"]
PLANTS = ["trees", "roses", "tulips", "bushes", "carrots", "sunflowers"]
VEHICLES = ["bus", "train", "truck", "van", "boat"]

EQUATION = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")


def _add(a, b):
    return f"{a} + {b} = {a + b}", a + b


def _sub(a, b):
    return f"{a} - {b} = {a - b}", a - b


def _mul(a, b):
    return f"{a} * {b} = {a * b}", a * b


def _div(a, b):
    assert a % b == 0
    return f"{a} / {b} = {a // b}", a // b


class Retry(Exception):
    """The drawn numbers break a bound; draw again."""


def _check(*values):
    for v in values:
        if v <= 0 or v > MAX_RESULT:
            raise Retry()


# Each template draws its numbers from rng and returns (question, [sentences], answer). Sentences
# hold one equation each; the final "The answer is N." is appended by make_problem.

def t_shop(rng):
    who, item = rng.choice(NAMES), rng.choice(SHOP_ITEMS)
    a = rng.randint(40, 600)
    if rng.random() < 0.5:
        b = rng.randint(2, a - 1)
        boxes, per = rng.randint(2, 9), rng.randint(2, 12)
        e1, left = _sub(a, b)
        e2, new = _mul(boxes, per)
        e3, total = _add(left, new)
        _check(left, new, total)
        q = (f"{who}'s shop has {a} {item}. It sells {b} {item}. Then it gets {boxes} boxes with "
             f"{per} {item} in each box. How many {item} does the shop have now?")
        steps = [f"After the sales {e1} {item} are left.", f"The boxes hold {e2} {item}.",
                 f"Now the shop has {e3} {item}."]
        return q, steps, total
    b, c = rng.randint(2, a // 2), rng.randint(2, a // 2)
    e1, s = _add(b, c)
    e2, left = _sub(a, s)
    _check(s, left)
    q = (f"{who}'s shop has {a} {item}. It sells {b} {item} in the morning and {c} {item} in the "
         f"afternoon. How many {item} are left?")
    steps = [f"The shop sells {e1} {item} in total.", f"So {e2} {item} are left."]
    return q, steps, left


def t_classroom(rng):
    who = rng.choice(NAMES)
    rooms, per = rng.randint(2, 12), rng.randint(12, 35)
    e1, students = _mul(rooms, per)
    absent = rng.randint(1, max(1, students // 4))
    e2, present = _sub(students, absent)
    _check(students, present)
    q = (f"{who}'s school has {rooms} classrooms with {per} students in each classroom. {absent} "
         f"students are absent today.")
    steps = [f"The school has {e1} students.", f"Today {e2} students are present."]
    if rng.random() < 0.5:
        divisors = [d for d in range(2, 10) if present % d == 0]
        if not divisors:
            raise Retry()
        teams = rng.choice(divisors)
        e3, each = _div(present, teams)
        q += f" The students who are present form {teams} teams of equal size."
        steps.append(f"Each team has {e3} students.")
        return q + " How many students are in each team?", steps, each
    return q + " How many students are present?", steps, present


def t_trip(rng):
    vehicle = rng.choice(VEHICLES)
    a, b = rng.randint(5, 90), rng.randint(5, 90)
    days = rng.randint(2, 9)
    e1, day = _add(a, b)
    e2, total = _mul(day, days)
    _check(day, total)
    q = (f"A {vehicle} travels {a} km in the morning and {b} km in the afternoon. It makes the same "
         f"trip every day for {days} days.")
    steps = [f"Each day the {vehicle} travels {e1} km.", f"In {days} days it travels {e2} km."]
    if rng.random() < 0.5:
        back = rng.randint(2, total - 1)
        e3, rest = _sub(total, back)
        _check(rest)
        q += f" On the way home it has already covered {back} km of that distance."
        steps.append(f"There are {e3} km still to go.")
        return q + " How many km are still to go?", steps, rest
    return q + " How many km does it travel in total?", steps, total


def t_recipe(rng):
    who, food = rng.choice(NAMES), rng.choice(BAKED)
    per, n = rng.randint(3, 40), rng.randint(2, 12)
    e1, need = _mul(per, n)
    have = need + rng.randint(1, 400)
    e2, left = _sub(have, need)
    _check(need, have, left)
    q = (f"One batch of {food} needs {per} grams of butter. {who} bakes {n} batches and has {have} "
         f"grams of butter.")
    steps = [f"{who} uses {e1} grams of butter.", f"{who} has {e2} grams of butter left."]
    if rng.random() < 0.4:
        divisors = [d for d in range(2, 10) if left % d == 0]
        if not divisors:
            raise Retry()
        jars = rng.choice(divisors)
        e3, each = _div(left, jars)
        q += f" The butter that is left is shared equally among {jars} jars."
        steps.append(f"Each jar gets {e3} grams.")
        return q + " How many grams of butter go in each jar?", steps, each
    return q + " How many grams of butter are left?", steps, left


def t_savings(rng):
    who = rng.choice(NAMES)
    weekly, weeks = rng.randint(3, 60), rng.randint(2, 15)
    e1, saved = _mul(weekly, weeks)
    spent = rng.randint(1, saved - 1) if saved > 2 else 1
    e2, left = _sub(saved, spent)
    _check(saved, left)
    q = f"{who} saves {weekly} dollars every week for {weeks} weeks. Then {who} spends {spent} dollars on a bike."
    steps = [f"{who} saves {e1} dollars.", f"After buying the bike {who} has {e2} dollars."]
    if rng.random() < 0.5:
        gift = rng.randint(2, 150)
        e3, total = _add(left, gift)
        _check(total)
        q += f" Then {who} gets {gift} dollars as a gift."
        steps.append(f"With the gift {who} has {e3} dollars.")
        return q + f" How many dollars does {who} have now?", steps, total
    return q + f" How many dollars does {who} have left?", steps, left


def t_garden(rng):
    who, plant = rng.choice(NAMES), rng.choice(PLANTS)
    rows, per = rng.randint(2, 20), rng.randint(3, 30)
    e1, planted = _mul(rows, per)
    dead = rng.randint(1, max(1, planted // 3))
    e2, alive = _sub(planted, dead)
    _check(planted, alive)
    q = f"{who} plants {rows} rows of {plant} with {per} {plant} in each row. {dead} of the {plant} do not grow."
    steps = [f"{who} plants {e1} {plant}.", f"{e2} {plant} grow."]
    if rng.random() < 0.5:
        more = rng.randint(2, 200)
        e3, total = _add(alive, more)
        _check(total)
        q += f" Later {who} plants {more} more {plant} that all grow."
        steps.append(f"Now {who} has {e3} {plant}.")
        return q + f" How many {plant} does {who} have now?", steps, total
    return q + f" How many {plant} grow?", steps, alive


def t_reading(rng):
    who = rng.choice(NAMES)
    per_day, days = rng.randint(4, 45), rng.randint(2, 14)
    e1, read = _mul(per_day, days)
    pages = read + rng.randint(1, 500)
    e2, rest = _sub(pages, read)
    _check(read, pages, rest)
    q = f"A book has {pages} pages. {who} reads {per_day} pages every day for {days} days."
    steps = [f"{who} reads {e1} pages.", f"There are {e2} pages left to read."]
    return q + f" How many pages does {who} still have to read?", steps, rest


def t_packing(rng):
    who, food = rng.choice(NAMES), rng.choice(BAKED)
    per_bag, bags = rng.randint(2, 12), rng.randint(2, 40)
    total = per_bag * bags
    price = rng.randint(2, 15)
    e1, n = _div(total, per_bag)
    e2, money = _mul(n, price)
    _check(total, n, money)
    q = (f"{who} bakes {total} {food} and packs them into bags of {per_bag}. Each bag sells for "
         f"{price} dollars.")
    steps = [f"{who} fills {e1} bags.", f"Selling every bag brings {e2} dollars."]
    if rng.random() < 0.5:
        cost = rng.randint(1, money - 1) if money > 2 else 1
        e3, profit = _sub(money, cost)
        _check(profit)
        q += f" The ingredients cost {cost} dollars."
        steps.append(f"The profit is {e3} dollars.")
        return q + f" How many dollars of profit does {who} make after selling every bag?", steps, profit
    return q + f" How many dollars does {who} get for all the bags?", steps, money


def t_party(rng):
    who = rng.choice(NAMES)
    boys, girls, k = rng.randint(3, 40), rng.randint(3, 40), rng.randint(2, 9)
    e1, kids = _add(boys, girls)
    e2, balloons = _mul(kids, k)
    _check(kids, balloons)
    q = f"There are {boys} boys and {girls} girls at {who}'s party. Each child gets {k} balloons."
    steps = [f"There are {e1} children.", f"They need {e2} balloons."]
    if rng.random() < 0.5:
        bag = rng.choice([d for d in (2, 3, 4, 5, 6, 8, 10) if balloons % d == 0] or [0])
        if bag == 0:
            raise Retry()
        e3, packs = _div(balloons, bag)
        q += f" Balloons come in packs of {bag}."
        steps.append(f"They need {e3} packs.")
        return q + " How many packs of balloons are needed?", steps, packs
    return q + " How many balloons are needed?", steps, balloons


def t_theater(rng):
    seats = rng.randint(100, 900)
    fri, sat = rng.randint(10, seats // 2), rng.randint(10, seats // 2)
    e1, sold = _add(fri, sat)
    e2, empty = _sub(seats, sold)
    _check(sold, empty)
    q = (f"A theater has {seats} seats for a show. {fri} tickets are sold on Friday and {sat} "
         f"tickets on Saturday.")
    steps = [f"{e1} tickets are sold.", f"So {e2} tickets are still available."]
    return q + " How many tickets are still available?", steps, empty


TEMPLATES = [t_shop, t_classroom, t_trip, t_recipe, t_savings, t_garden, t_reading, t_packing,
             t_party, t_theater]


def make_problem(seed, pid):
    """The problem drawn from random.Random(seed) (redrawing from the same stream on Retry)."""
    rng = random.Random(seed)
    template = TEMPLATES[rng.randrange(len(TEMPLATES))]
    while True:
        try:
            q, steps, answer = template(rng)
            break
        except Retry:
            continue
    solution = " ".join(steps) + f" The answer is {answer}."
    return {"id": pid, "question": q, "solution": solution, "answer": answer}


def problems(split, n, start=0):
    base = SPLIT_BASE[split]
    return [make_problem(base + i, f"{split}-{i}") for i in range(start, start + n)]


def training_problems(n, start=0, exclude_questions=()):
    """n training problems from seeds start, start+1, ... (skipping held-out questions)."""
    exclude = set(exclude_questions)
    out, i = [], start
    while len(out) < n:
        assert i < TRAIN_SEED_LIMIT, "training seeds exhausted"
        p = make_problem(i, f"train-{i}")
        i += 1
        if p["question"] not in exclude:
            out.append(p)
    return out


def check_problem(p):
    """Recomputes every equation of the solution; returns a list of what is wrong (empty: fine)."""
    errs = []
    eqs = EQUATION.findall(p["solution"])
    if not 2 <= len(eqs) <= 3:
        errs.append(f"{len(eqs)} equations")
    known = {int(x) for x in re.findall(r"\d+", p["question"])}
    last = None
    for a, op, b, c in eqs:
        a, b, c = int(a), int(b), int(c)
        want = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b and a % b == 0 else None}[op]
        if want != c:
            errs.append(f"{a} {op} {b} = {c} is wrong")
        if a not in known or b not in known:
            errs.append(f"operand of {a} {op} {b} is neither in the question nor an earlier result")
        if not 0 < c <= MAX_RESULT:
            errs.append(f"result {c} out of bounds")
        known.add(c)
        last = c
    m = re.fullmatch(r".*The answer is (\d+)\.", p["solution"])
    if not m or int(m.group(1)) != p["answer"] or last != p["answer"]:
        errs.append("final answer does not match the last equation")
    return errs


# ---------------------------------------------------------------------------------------------
# Chat renderings of a problem in DeepSeek-V3.2's format (the bundled model's: config model_type
# deepseek_v32), byte for byte what osprey's chat encoder (src/tokenizer/chat.cpp, format
# deepseek-v3.2, after DeepSeek's encoding_dsv32.py) renders for the same messages; the ctest
# arith_chat_render checks that on chat_samples(). Three kinds:
#   plain     <bos><｜User｜>{q}<｜Assistant｜></think>   → "{solution}<eos>"
#   thinking  <bos><｜User｜>{q}<｜Assistant｜><think>    → "{steps}</think>The answer is N.<eos>"
#   tool      <bos>\n\n{tools block}<｜User｜>{q}<｜Assistant｜></think>
#                 → "\n\n<｜DSML｜function_calls>…{expression}…</｜DSML｜function_calls><eos>"
#             then \n\n<function_results>\n<result>{N}</result>\n</function_results>\n\n</think>
#                 → "The answer is N.<eos>"

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT, THINK, END_THINK = "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"
DSML = "｜DSML｜"

# The tool the model learns to call, as a client sends it (the key order is part of the prompt).
CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression of whole numbers with + - * / and "
                       "parentheses, and returns its value.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string",
                                          "description": "The expression, e.g. (12 + 5) * 3"}},
            "required": ["expression"],
        },
    },
}

TOOLS_TEMPLATE = (
    "## Tools\n"
    "You have access to a set of tools you can use to answer the user's question.\n"
    "You can invoke functions by writing a \"<{d}function_calls>\" block like the following as "
    "part of your reply to the user:\n"
    "<{d}function_calls>\n"
    "<{d}invoke name=\"$FUNCTION_NAME\">\n"
    "<{d}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{d}parameter>\n"
    "...\n"
    "</{d}invoke>\n"
    "<{d}invoke name=\"$FUNCTION_NAME2\">\n"
    "...\n"
    "</{d}invoke>\n"
    "</{d}function_calls>\n"
    "String and scalar parameters should be specified as is without any escaping or quotes, while "
    "lists and objects should use JSON format. The \"string\" attribute should be set to \"true\" "
    "for string type parameters and \"false\" for other types (numbers, booleans, arrays, "
    "objects).\n"
    "If the thinking_mode is enabled, then after function results you should strongly consider "
    "outputting a thinking block. Here is an example:\n"
    "<{d}function_calls>\n"
    "...\n"
    "</{d}function_calls>\n"
    "<function_results>\n"
    "...\n"
    "</function_results>\n"
    "<think>...thinking about results</think>\n"
    "Here are the functions available in JSONSchema format:\n"
    "<functions>\n"
    "{schemas}\n"
    "</functions>\n")


def tools_block(tools):
    schemas = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    return "\n\n" + TOOLS_TEMPLATE.replace("{d}", DSML).replace("{schemas}", schemas)


def expression(p):
    """The solution's equations as one expression: each earlier result replaced by its
    parenthesised expression ("(600 - 35) + (4 * 12)")."""
    exprs = {}  # result -> its expression, until used
    last = None
    for a, op, b, c in EQUATION.findall(p["solution"]):
        parts = []
        for x in (a, b):
            parts.append(f"({exprs.pop(x)})" if x in exprs else x)
        last = f"{parts[0]} {op} {parts[1]}"
        exprs[c] = last
    return last


def calculate(expr):
    """The calculator tool: whole numbers, + - * /, parentheses (no eval); exact division
    gives a whole number, inexact a decimal. Raises ValueError on anything else."""
    tokens = re.findall(r"\d+|[-+*/()]|\S", expr)
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def take():
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def atom():
        t = take() if peek() is not None else None
        if t == "(":
            v = add()
            if take() != ")":
                raise ValueError("missing )")
            return v
        if t is not None and t.isdigit():
            return int(t)
        raise ValueError(f"unexpected {t!r}")

    def mul():
        v = atom()
        while peek() in ("*", "/"):
            op, r = take(), atom()
            if op == "*":
                v = v * r
            else:
                if r == 0:
                    raise ValueError("division by zero")
                v = v // r if v % r == 0 else v / r
        return v

    def add():
        v = mul()
        while peek() in ("+", "-"):
            op, r = take(), mul()
            v = v + r if op == "+" else v - r
        return v

    v = add()
    if pos != len(tokens):
        raise ValueError("trailing input")
    return str(v)


def tool_call_text(expr):
    return (f"\n\n<{DSML}function_calls>\n<{DSML}invoke name=\"calculator\">\n<{DSML}parameter "
            f"name=\"expression\" string=\"true\">{expr}</{DSML}parameter>\n</{DSML}invoke>\n"
            f"</{DSML}function_calls>")


def tool_result_text(result):
    return f"\n\n<function_results>\n<result>{result}</result>\n</function_results>\n\n{END_THINK}"


def split_solution(p):
    """(steps, final sentence) of a solution."""
    final = f"The answer is {p['answer']}."
    assert p["solution"].endswith(" " + final)
    return p["solution"][:-len(final) - 1], final


def chat_segments(p, kind):
    """[(text, trained)]: the conversation of one problem; `trained` marks model output (the
    loss), the rest is prompt or tool result. Every boundary falls on a special token."""
    q = p["question"]
    if kind == "plain":
        return [(f"{BOS}{USER}{q}{ASSISTANT}{END_THINK}", False), (p["solution"] + EOS, True)]
    steps, final = split_solution(p)
    if kind == "thinking":
        return [(f"{BOS}{USER}{q}{ASSISTANT}{THINK}", False),
                (f"{steps}{END_THINK}{final}{EOS}", True)]
    assert kind == "tool"
    expr = expression(p)
    result = calculate(expr)
    assert result == str(p["answer"]), (expr, result, p)
    return [(f"{BOS}{tools_block([CALCULATOR_TOOL])}{USER}{q}{ASSISTANT}{END_THINK}", False),
            (tool_call_text(expr) + EOS, True), (tool_result_text(result), False),
            (final + EOS, True)]


def chat_samples(n):
    """Lines for tests/tokenizer/reference_check.cpp (format deepseek-v3.2; text only): each
    kind's prompt, and the tool kind after its call and after its result, as OpenAI messages."""
    out = []
    for i, p in enumerate(problems("dev", n)):
        kind = ("plain", "thinking", "tool")[i % 3]
        segs = chat_segments(p, kind)
        msgs = [{"role": "user", "content": p["question"]}]
        tools = []
        if kind == "tool":
            tools = [json.dumps(CALCULATOR_TOOL["function"], ensure_ascii=False)]
        out.append({"category": f"arith-{kind}-prompt", "format": "deepseek-v3.2",
                    "thinking": kind == "thinking", "add_generation_prompt": True,
                    "messages": msgs, "tools": tools, "text": segs[0][0]})
        if kind == "tool":
            call = {"id": f"call_{i}", "type": "function",
                    "function": {"name": "calculator",
                                 "arguments": json.dumps({"expression": expression(p)})}}
            msgs2 = msgs + [{"role": "assistant", "content": None, "tool_calls": [call]},
                            {"role": "tool", "tool_call_id": f"call_{i}", "content": segs[2][0][
                                len("\n\n<function_results>\n<result>"):].split("</result>")[0]}]
            out.append({"category": "arith-tool-after-result", "format": "deepseek-v3.2",
                        "thinking": False, "add_generation_prompt": True, "messages": msgs2,
                        "tools": tools, "text": segs[0][0] + segs[1][0] + segs[2][0]})
            final_msgs = msgs2 + [{"role": "assistant", "content": segs[3][0][:-len(EOS)]}]
            out.append({"category": "arith-tool-answered", "format": "deepseek-v3.2",
                        "thinking": False, "add_generation_prompt": True, "messages": final_msgs,
                        "tools": tools, "text": "".join(s for s, _ in segs)})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=sorted(SPLIT_BASE))
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--chat-samples", action="store_true",
                    help="write chat renderings (plain, thinking, tool) of n dev problems as "
                         "JSONL for tokenizer_reference_check")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--out", help="JSONL file (default: stdout)")
    ap.add_argument("--print", action="store_true", help="human-readable instead of JSONL")
    args = ap.parse_args()
    if args.chat_samples:
        with open(args.out, "w", encoding="utf-8") if args.out else sys.stdout as f:
            for line in chat_samples(args.n):
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
        return
    if args.split is None:
        ap.error("--split is required")
    ps = problems(args.split, args.n, args.start)
    f = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
    for p in ps:
        if args.print:
            f.write(f"{p['id']}: {p['question']}\n  {p['solution']}\n")
        else:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    if args.out:
        f.close()


if __name__ == "__main__":
    main()
